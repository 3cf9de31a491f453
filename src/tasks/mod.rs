//! Host side of reconnectable tasks: ids, launch encoding, paging, states.
