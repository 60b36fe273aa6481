"""One unary gRPC-Web call with sonora (a gRPC-Web client library), printed as JSON.

usage: grpc_web_call.py http://HOST:PORT /package.Service/Method MESSAGE [KEY=VALUE ...]

The message travels as raw bytes. The output holds the status code sonora reports and its
details, or, when the library could not read a gRPC status from the answer at all, the code
NOT_A_STATUS and what it raised instead: what a gRPC-Web application would see.
"""

import json
import sys

from sonora import client, protocol


def main(argv):
    url, method, message = argv[1], argv[2], argv[3].encode()
    metadata = [tuple(kv.split("=", 1)) for kv in argv[4:]]
    out = {}
    with client.insecure_web_channel(url) as channel:
        call = channel.unary_unary(
            method,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            reply = call(message, metadata=metadata, timeout=10)
            out["code"] = "OK"
            out["reply"] = (reply or b"").decode(errors="replace")
        except protocol.WebRpcError as e:
            out["code"] = e.code().name
            out["details"] = e.details()
        except Exception as e:  # noqa: BLE001 - the point is to report what a client meets
            out["code"] = "NOT_A_STATUS"
            out["details"] = repr(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
