#!/usr/bin/env python3
"""Raw ferry protocol clients for bench/hostile.sh, written from docs/PROTOCOL.md.

    hostile_client.py HOST:PORT PATH MODE [N] [RATE]

MODE:
  stuck  N connections each pipeline 64 Reads of 1 MiB of PATH and never read a byte.
  slow   N connections each keep 64 Reads of PATH in flight and read the responses at RATE
         bytes per second (an honest client on a slow link); prints the bytes each got.
  idle   N connections complete the handshake and send nothing more.
  silent N connections open TCP and send nothing at all (never authenticate).
  listings N connections each pipeline 64 ReadDir pages of 4,096 entries of directory PATH
         and never read a byte.
  dirdata  the same with ReadDirData (listings with the contents of files up to 1 MiB).
  partial  N connections each send all but the last byte of the longest legal request
         (MAX_REQUEST_FRAME) and then nothing.

Runs until killed (SIGTERM): then `slow` prints "slow BYTES SECONDS" per connection.
"""
import signal
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20


def frame(kind, rid, body):
    return struct.pack(">IBI", len(body) + 5, kind, rid) + body


DIR_DATA = 0x10
MAX_REQUEST_FRAME = 5127


def hello(name, features=0):
    n = name.encode()
    body = struct.pack(">HQI", 2, features, CHUNK) + struct.pack(">H", len(n)) + n
    return frame(0x01, 0, body)


_seq = [0]


def next_name():
    # Each connection a client of its own (the server shares memory per client too).
    _seq[0] += 1
    return f"bench {_seq[0]} {time.monotonic_ns()}"


def read_req(rid, path, offset):
    p = path.encode()
    body = struct.pack(">H", len(p)) + p + struct.pack(">QIB", offset, CHUNK, 0)
    return frame(0x13, rid, body)


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise ConnectionError("closed")
        buf += got
    return bytes(buf)


def list_req(rid, path, with_data):
    p = path.encode()
    body = struct.pack(">H", len(p)) + p + struct.pack(">QI", 0, 4096)
    if with_data:
        return frame(0x17, rid, body + struct.pack(">IB", CHUNK, 0))
    return frame(0x12, rid, body)


def connect(addr, handshake=True, features=0):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    if not handshake:
        return s
    s.sendall(b"FERRY\x01\x00\x00" + hello(next_name(), features))
    pre = recv_exact(s, 8)
    if pre[6] == 0xFF:
        raise ConnectionError(f"refused, code {pre[7]}")
    (length,) = struct.unpack(">I", recv_exact(s, 4))
    recv_exact(s, length)  # the Welcome
    return s


def stuck(addr, path, size):
    s = connect(addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"".join(read_req(i + 1, path, (i * CHUNK) % size) for i in range(64)))
    return s


def listings(addr, path, with_data):
    s = connect(addr, features=DIR_DATA if with_data else 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"".join(list_req(i + 1, path, with_data) for i in range(64)))
    return s


def partial(addr):
    s = connect(addr)
    # A Read frame of the longest legal length, its last byte never sent.
    whole = struct.pack(">IBI", MAX_REQUEST_FRAME, 0x13, 1) + bytes(MAX_REQUEST_FRAME - 5)
    s.sendall(whole[:-1])
    return s


def slow(addr, path, size, rate, results, idx):
    s = connect(addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    rid = 0
    for _ in range(64):
        rid += 1
        s.sendall(read_req(rid, path, (rid * CHUNK) % size))
    got, t0 = 0, time.monotonic()
    try:
        while True:
            (length,) = struct.unpack(">I", recv_exact(s, 4))
            left = length
            while left:
                n = min(left, 64 << 10)
                recv_exact(s, n)
                left -= n
                got += n
                results[idx] = (got, time.monotonic() - t0)
                # Paced: no faster than `rate` on average.
                ahead = got / rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
            rid += 1
            s.sendall(read_req(rid, path, (rid * CHUNK) % size))
    except (ConnectionError, OSError):
        return


def main():
    addr, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    rate = float(sys.argv[5]) if len(sys.argv) > 5 else 2 << 20
    size = int(sys.argv[6]) if len(sys.argv) > 6 else 64 << 20
    held, results = [], [(0, 0.0)] * n
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if mode == "slow":
        for i in range(n):
            threading.Thread(
                target=slow, args=(addr, path, size, rate, results, i), daemon=True
            ).start()
    else:
        for _ in range(n):
            try:
                if mode == "stuck":
                    held.append(stuck(addr, path, size))
                elif mode == "idle":
                    held.append(connect(addr))
                elif mode in ("listings", "dirdata"):
                    held.append(listings(addr, path, mode == "dirdata"))
                elif mode == "partial":
                    held.append(partial(addr))
                else:
                    held.append(connect(addr, handshake=False))
            except (ConnectionError, OSError) as e:
                print(f"{mode}: {e}", file=sys.stderr)
    print(f"{mode}: {len(held) if mode != 'slow' else n} connections", file=sys.stderr, flush=True)
    stop.wait()
    for got, secs in results if mode == "slow" else []:
        print(f"slow {got} {secs:.2f}")


if __name__ == "__main__":
    main()
