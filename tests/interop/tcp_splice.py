"""Byte pumping for the test balancers of the Redis session scripts: joins a
client connection to an upstream one until either side closes."""

import asyncio


async def splice(reader, writer, up_reader, up_writer):
    """Copies both ways between (reader, writer) and (up_reader, up_writer) until both directions end."""

    async def pump(src, dst):
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
