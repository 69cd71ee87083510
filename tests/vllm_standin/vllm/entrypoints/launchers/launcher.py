"""Stand-in for vllm/entrypoints/launchers/launcher.py: `setup_server` validates, then binds the API socket.

Mirrors vLLM 0.33.0 launcher.py lines 340-356 (`create_server_socket`), 358-361 (`create_server_unix_socket`)
and 365-398 (`setup_server`: `validate_api_server_args`, then the socket). Plugin loading
(`init_parser_plugin`, line 369), logging and `set_ulimit` are not reproduced.
"""

import socket

from vllm.entrypoints.common.cli_args import validate_api_server_args


def create_server_socket(addr, *, reuse_port):
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


def create_server_unix_socket(path):
    sock = socket.socket(family=socket.AF_UNIX, type=socket.SOCK_STREAM)
    sock.bind(path)
    return sock


def setup_server(args, *, reuse_port):
    validate_api_server_args(args)
    if args.uds:
        sock = create_server_unix_socket(args.uds)
        return f"unix:{args.uds}", sock
    sock_addr = (args.host or "", args.port)
    sock = create_server_socket(sock_addr, reuse_port=reuse_port)
    return f"http://{sock_addr[0] or '0.0.0.0'}:{sock_addr[1]}", sock
