#!/usr/bin/env python3
"""TCP forwarding for the fault suite's network cuts (examples/bank-accounts/tests/chaos.rs).

    forward.py LISTEN_HOST:PORT=TARGET_HOST:PORT [...]

Accepts on each listen address and copies bytes both ways to its target, until either side
closes. Run on the host and inside the projector's network namespace, it carries the
projector's connections over the veth links that the suite takes down to cut the network:
a link down leaves the connections open and silent, as a real partition does.
"""

import asyncio
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen, target):
    (lhost, lport), (thost, tport) = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in (listen, target))]

    async def accepted(reader, writer):
        try:
            treader, twriter = await asyncio.open_connection(thost, tport)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, twriter), pipe(treader, writer))

    server = await asyncio.start_server(accepted, lhost, lport, reuse_address=True)
    async with server:
        await server.serve_forever()


async def main(pairs):
    await asyncio.gather(*(serve(*pair.split("=", 1)) for pair in pairs))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("forwarding", " ".join(sys.argv[1:]), flush=True)
    asyncio.run(main(sys.argv[1:]))
