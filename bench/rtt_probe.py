"""Round-trip probe for bench/run.sh: the time one 16 KiB read takes on the emulated link.

server PORT: answers every request of up to 64 bytes with 16 KiB.
client PORT N: sends N requests one after another and prints the mean round trip in ms.
This is the best any client can do per read with one read outstanding, so with J jobs the
bound on random-read IOPS is J / mean round trip."""
import socket, sys, time, threading
mode = sys.argv[1]
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[2]))); s.listen(8)
    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 16384
        while True:
            d = c.recv(64)
            if not d: return
            c.sendall(payload)
    while True:
        c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
else:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = int(sys.argv[3]); ts = []
    for _ in range(n):
        t = time.perf_counter(); c.sendall(b"q" * 60); got = 0
        while got < 16384:
            d = c.recv(65536)
            if not d:
                sys.exit("rtt_probe: the connection closed")
            got += len(d)
        ts.append(time.perf_counter() - t)
    ts.sort(); print("%.3f" % (sum(ts) / len(ts) * 1e3))
