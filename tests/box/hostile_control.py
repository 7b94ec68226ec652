"""Whoever runs as the server's user answering on the control socket in the front door's
place (issue #37): ``drip`` sends a valid answer one byte a second (headers too),
``huge`` a body of SIZE bytes as fast as it can, ``garbage`` a 200 with bytes that are not
JSON; ``slow`` is a front door bringing a model in: a valid answer after SIZE seconds.
Serves until killed."""

from __future__ import annotations

import socket
import sys
import threading
import time

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


def answer(conn: socket.socket, mode: str, size: int) -> None:
    with conn:
        conn.recv(65536)
        try:
            if mode == "drip":
                for byte in HEAD + b"Content-Length: 20\r\n\r\n" + b'{"models": {}}      ':
                    conn.sendall(bytes([byte]))
                    time.sleep(1.0)
            elif mode == "huge":
                conn.sendall(HEAD + b"Content-Length: %d\r\n\r\n{" % size)
                chunk = b" " * (1 << 20)
                for _ in range(size // len(chunk)):
                    conn.sendall(chunk)
            elif mode == "slow":
                time.sleep(size)
                conn.sendall(HEAD + b'Content-Length: 23\r\n\r\n{"status": "in slowly"}')
            else:
                conn.sendall(HEAD + b"Content-Length: 4\r\n\r\n\xff\xfe[[")
        except OSError:
            return  # the reader gave up: as it should


def main(path: str, mode: str, size: int) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(16)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=answer, args=(conn, mode, size), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
