"""One unary gRPC call with grpcio (a real gRPC library), printed as JSON.

usage: grpc_call.py HOST:PORT /package.Service/Method MESSAGE [--timeout SECONDS] [KEY=VALUE ...]

The message travels as raw bytes (no protobuf schema needed). The output holds the status code
grpcio reports, its details, the initial and trailing metadata and the reply, so a test can
check what a gRPC application would see.
"""

import json
import sys

import grpc


def main(argv):
    target, method, message = argv[1], argv[2], argv[3].encode()
    rest = argv[4:]
    timeout = None
    if rest[:1] == ["--timeout"]:
        timeout = float(rest[1])
        rest = rest[2:]
    metadata = [tuple(kv.split("=", 1)) for kv in rest]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            method,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        out = {}
        try:
            reply, state = call.with_call(message, metadata=metadata, timeout=timeout)
            out["reply"] = reply.decode(errors="replace")
        except grpc.RpcError as e:
            state = e
        out["code"] = state.code().name
        out["details"] = state.details()
        out["initial"] = dict(state.initial_metadata() or [])
        out["trailing"] = dict(state.trailing_metadata() or [])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
