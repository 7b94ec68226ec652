"""Prints every TCP reset seen on the loopback interface, with the last 12 packets of its
connection (root: a packet socket). Behind resets-*.log."""

import collections
import socket
import struct
import time

RST, FLAGS = 0x04, {0x01: "F", 0x02: "S", 0x04: "R", 0x08: "P", 0x10: "."}

sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
sniffer.bind(("lo", 0))
sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
ring: dict[tuple[int, ...], collections.deque[str]] = collections.defaultdict(
    lambda: collections.deque(maxlen=12)
)
while True:
    data, address = sniffer.recvfrom(65535)
    if address[2] == socket.PACKET_OUTGOING:
        continue  # a loopback packet shows twice
    if len(data) < 34 or data[12:14] != b"\x08\x00" or data[23] != 6:
        continue  # IPv4 TCP only
    ihl = (data[14] & 0x0F) * 4
    total = struct.unpack("!H", data[16:18])[0]
    tcp = 14 + ihl
    source, dest, _seq, _ack, offset, flags = struct.unpack("!HHIIBB", data[tcp : tcp + 14])
    payload = total - ihl - (offset >> 4) * 4
    key = tuple(sorted((source, dest)))
    shown = "".join(name for bit, name in FLAGS.items() if flags & bit)
    ring[key].append(f"{time.time():.3f} {source}->{dest} [{shown}] len={payload}")
    if flags & RST:
        print("RST on", key, flush=True)
        for line in ring[key]:
            print("   ", line, flush=True)
