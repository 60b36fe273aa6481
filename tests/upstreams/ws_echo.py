"""A WebSocket echo upstream for tests (the `websockets` library from PyPI).

usage: ws_echo.py PORT

Echoes every message back. It never pings (so a quiet connection is really quiet) and takes
messages of any size. GET /health (any non-WebSocket request) answers 200 "ok" so a harness
can tell when it is up.
"""

import asyncio
import http
import sys

from websockets.asyncio.server import serve


async def echo(ws):
    try:
        async for message in ws:
            await ws.send(message)
    except Exception:
        pass


def health(connection, request):
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return connection.respond(http.HTTPStatus.OK, "ok\n")
    return None


async def main(port):
    async with serve(
        echo,
        "127.0.0.1",
        port,
        ping_interval=None,
        max_size=None,
        process_request=health,
    ) as server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
