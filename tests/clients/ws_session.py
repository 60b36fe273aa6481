"""A WebSocket client session for tests (the `websockets` library from PyPI), step by step,
one JSON line per step on stdout (flushed, so a harness can follow it).

usage: ws_session.py URL [--header NAME:VALUE ...] STEP ...

Steps:
  echo:N            send a binary message of N random bytes (incompressible: the connection
                    may use permessage-deflate), wait for it to come back whole
  idle:SECONDS      do nothing that long
  closed_within:S   wait up to S seconds for the other side to close the connection;
                    prints {"closed": true|false}
  hold              print {"holding": true}, then keep the connection until stdin closes
The handshake refused prints {"refused": STATUS} and nothing else. The client never pings.
"""

import asyncio
import json
import os
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus


def say(obj):
    print(json.dumps(obj), flush=True)


async def hold_until_stdin_closes():
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


async def main(argv):
    url, rest = argv[1], argv[2:]
    headers = []
    while rest[:1] == ["--header"]:
        name, value = rest[1].split(":", 1)
        headers.append((name, value))
        rest = rest[2:]
    try:
        ws = await connect(
            url,
            additional_headers=headers,
            ping_interval=None,
            max_size=None,
            open_timeout=30,
        )
    except InvalidStatus as e:
        say({"refused": e.response.status_code})
        return
    say({"open": True})
    async with ws:
        for step in rest:
            kind, _, arg = step.partition(":")
            if kind == "echo":
                data = os.urandom(int(arg))
                try:
                    await ws.send(data)
                    back = await asyncio.wait_for(ws.recv(), 30)
                    say({"echo": back == data})
                except (ConnectionClosed, asyncio.TimeoutError) as e:
                    say({"echo": False, "error": type(e).__name__})
            elif kind == "idle":
                await asyncio.sleep(float(arg))
            elif kind == "closed_within":
                try:
                    await asyncio.wait_for(ws.recv(), float(arg))
                    say({"closed": False, "message": True})
                except ConnectionClosed:
                    say({"closed": True})
                except asyncio.TimeoutError:
                    say({"closed": False})
            elif kind == "hold":
                say({"holding": True})
                await hold_until_stdin_closes()
            else:
                raise SystemExit(f"unknown step {step!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv))
