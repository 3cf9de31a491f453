//! Pages of task output as the gateway returns them: paging arguments,
//! the widened window fetched so that the gateway's own secrets are masked
//! (by [`crate::masking::Masker`]) even when a page boundary splits one, and
//! lossy UTF-8 decoding.

use base64::Engine as _;

use crate::masking::Masker;

/// Largest byte offset a caller may ask for (the stored prefix is 1 MiB).
pub const MAX_OFFSET: u64 = 1_048_576;
/// Page size bounds and default, bytes per stream.
pub const MIN_LIMIT: u64 = 1;
pub const MAX_LIMIT: u64 = 65_536;
pub const DEFAULT_LIMIT: u64 = 16_384;
/// Longest `wait_seconds`.
pub const MAX_WAIT_SECONDS: f64 = 30.0;
/// Largest window the supervisor serves in one call.
const SUPERVISOR_MAX_LIMIT: u64 = 1 << 20;
/// Why paging arguments are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PageError {
    #[error("{0} must be between 0 and 1048576 (bytes into the stored output)")]
    OffsetOutOfRange(&'static str),
    #[error("limit must be between 1 and 65536 bytes per stream")]
    LimitOutOfRange,
    #[error("wait_seconds must be between 0 and 30")]
    WaitOutOfRange,
}

/// Validated paging arguments of get_task / cancel_task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageRequest {
    pub stdout_offset: u64,
    pub stderr_offset: u64,
    pub limit: u64,
}

impl PageRequest {
    /// Signed inputs, so that a negative value gets the same clear message as a too-large one.
    pub fn new(stdout_offset: Option<i64>, stderr_offset: Option<i64>, limit: Option<i64>) -> Result<Self, PageError> {
        let offset = |v: Option<i64>, name| {
            u64::try_from(v.unwrap_or(0)).ok().filter(|v| *v <= MAX_OFFSET).ok_or(PageError::OffsetOutOfRange(name))
        };
        let stdout_offset = offset(stdout_offset, "stdout_offset")?;
        let stderr_offset = offset(stderr_offset, "stderr_offset")?;
        let limit = u64::try_from(limit.unwrap_or(DEFAULT_LIMIT as i64))
            .ok()
            .filter(|l| (MIN_LIMIT..=MAX_LIMIT).contains(l))
            .ok_or(PageError::LimitOutOfRange)?;
        Ok(Self { stdout_offset, stderr_offset, limit })
    }
}

/// Validates `wait_seconds` (0–30, finite).
pub fn check_wait(wait: Option<f64>) -> Result<f64, PageError> {
    let wait = wait.unwrap_or(0.0);
    if wait.is_finite() && (0.0..=MAX_WAIT_SECONDS).contains(&wait) { Ok(wait) } else { Err(PageError::WaitOutOfRange) }
}

/// The window asked of the supervisor for one page request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub stdout_offset: u64,
    pub stderr_offset: u64,
    pub limit: u64,
}

impl Window {
    /// Widens `page` by the masker's context on both sides.
    pub fn for_page(page: &PageRequest, masker: &Masker) -> Self {
        let ctx = masker.context();
        let limit = (page.limit + 2 * ctx).min(SUPERVISOR_MAX_LIMIT.max(page.limit));
        Self {
            stdout_offset: page.stdout_offset.saturating_sub(ctx),
            stderr_offset: page.stderr_offset.saturating_sub(ctx),
            limit,
        }
    }
}

/// One stream's page, cut from a window.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPage {
    /// Lossy UTF-8 text of the masked bytes.
    pub text: String,
    /// Offset of the first byte after the page.
    pub next_offset: u64,
}

/// Why a window could not be cut into a page.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the task supervisor returned a malformed output page")]
pub struct MalformedPage;

/// Decodes a window as the supervisor prints it (standard base64).
pub fn decode_window(window_b64: &str) -> Result<Vec<u8>, MalformedPage> {
    base64::engine::general_purpose::STANDARD.decode(window_b64).map_err(|_| MalformedPage)
}

/// Cuts the requested page out of a window (bytes from `window_offset`).
pub fn cut_page(
    window: &[u8],
    window_offset: u64,
    offset: u64,
    limit: u64,
    masker: &Masker,
) -> Result<StreamPage, MalformedPage> {
    let skip = offset.checked_sub(window_offset).ok_or(MalformedPage)?;
    let start = usize::try_from(skip).map_err(|_| MalformedPage)?.min(window.len());
    let len = usize::try_from(limit).map_err(|_| MalformedPage)?.min(window.len() - start);
    let end = start + len;
    let masked = masker.mask_range(window, start, end);
    Ok(StreamPage { text: String::from_utf8_lossy(&masked).into_owned(), next_offset: offset + len as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_arguments_are_bounded() {
        assert!(PageRequest::new(Some(1_048_576), Some(0), Some(65_536)).is_ok());
        assert_eq!(PageRequest::new(Some(1_048_577), None, None), Err(PageError::OffsetOutOfRange("stdout_offset")));
        assert_eq!(PageRequest::new(None, Some(1_048_577), None), Err(PageError::OffsetOutOfRange("stderr_offset")));
        assert_eq!(PageRequest::new(None, None, Some(0)), Err(PageError::LimitOutOfRange));
        assert_eq!(PageRequest::new(None, None, Some(65_537)), Err(PageError::LimitOutOfRange));
        assert_eq!(PageRequest::new(Some(-1), None, None), Err(PageError::OffsetOutOfRange("stdout_offset")));
        assert_eq!(PageRequest::new(None, None, Some(-5)), Err(PageError::LimitOutOfRange));
        assert_eq!(PageRequest::new(None, None, None).unwrap().limit, 16_384);
        assert_eq!(check_wait(Some(30.5)), Err(PageError::WaitOutOfRange));
        assert_eq!(check_wait(Some(f64::NAN)), Err(PageError::WaitOutOfRange));
        assert_eq!(check_wait(None), Ok(0.0));
    }

    #[test]
    fn pages_without_secrets_are_plain_slices() {
        let m = Masker::default();
        let page = PageRequest::new(Some(3), Some(0), Some(4)).unwrap();
        let w = Window::for_page(&page, &m);
        assert_eq!(w, Window { stdout_offset: 3, stderr_offset: 0, limit: 4 });
        let p = cut_page(b"defg", 3, 3, 4, &m).unwrap();
        assert_eq!(p, StreamPage { text: "defg".into(), next_offset: 7 });
        // Past the end: empty page, offset unchanged.
        assert_eq!(cut_page(b"", 50, 50, 4, &m).unwrap(), StreamPage { text: String::new(), next_offset: 50 });
    }

    #[test]
    fn split_utf8_becomes_replacement_character() {
        let m = Masker::default();
        let data = "aé".as_bytes(); // 61 c3 a9
        assert_eq!(cut_page(&data[..2], 0, 0, 2, &m).unwrap().text, "a\u{fffd}");
        assert_eq!(cut_page(&data[2..], 2, 2, 2, &m).unwrap().text, "\u{fffd}");
    }

    #[test]
    fn secrets_split_by_a_page_edge_are_masked_on_both_pages() {
        let m = Masker::new(["hunter2-secret", "xy"]).unwrap();
        assert_eq!(m.context(), 13);
        let stream = b"0123456789hunter2-secret tail hunter2-secreX xy";
        // Page [0, 15) cuts the secret (at 10..24) after 5 bytes.
        let page = PageRequest::new(Some(0), Some(0), Some(15)).unwrap();
        let w = Window::for_page(&page, &m);
        assert_eq!((w.stdout_offset, w.limit), (0, 41));
        let win = &stream[..41];
        let p1 = cut_page(win, 0, 0, 15, &m).unwrap();
        assert_eq!(p1.text, "0123456789***");
        assert_eq!(p1.next_offset, 15);
        // Next page starts inside the secret.
        let page2 = PageRequest::new(Some(15), Some(0), Some(15)).unwrap();
        let w2 = Window::for_page(&page2, &m);
        assert_eq!(w2.stdout_offset, 2);
        let win2 = &stream[2..(2 + w2.limit as usize).min(stream.len())];
        let p2 = cut_page(win2, 2, 15, 15, &m).unwrap();
        assert_eq!(p2.text, "*** tail ");
        assert_eq!(p2.next_offset, 30);
        // The look-alike (one byte differs) and the too-short value stay.
        assert_eq!(m.mask("hunter2-secreX xy"), "hunter2-secreX xy");
        // Replay returns the same page.
        assert_eq!(cut_page(win, 0, 0, 15, &m).unwrap(), p1);
    }
}
