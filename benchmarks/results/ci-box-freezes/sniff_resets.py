import socket, struct, time, collections, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
s.bind(("lo", 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
ring = collections.defaultdict(lambda: collections.deque(maxlen=12))
names = {0x01: "F", 0x02: "S", 0x04: "R", 0x08: "P", 0x10: "."}
while True:
    data, addr = s.recvfrom(65535)
    if addr[2] == socket.PACKET_OUTGOING:
        continue  # each loopback packet shows twice
    if len(data) < 14 + 20 or data[12:14] != b"\x08\x00":
        continue
    ihl = (data[14] & 0x0F) * 4
    tot = struct.unpack("!H", data[16:18])[0]
    tcp = 14 + ihl
    if data[23] != 6:
        continue
    sp, dp, seq, ack, off, flags = struct.unpack("!HHIIBB", data[tcp:tcp + 14])
    payload = tot - ihl - (off >> 4) * 4
    key = tuple(sorted((sp, dp)))
    f = "".join(v for k, v in names.items() if flags & k)
    line = f"{time.time():.3f} {sp}->{dp} [{f}] len={payload}"
    ring[key].append(line)
    if flags & 0x04:
        print("RST on", key, flush=True)
        for l in ring[key]:
            print("   ", l, flush=True)
