"""ferry_spec: an independent client for the ferry wire protocol (version 2, preamble 1),
written from docs/PROTOCOL.md alone.

Dependencies: Python 3 stdlib; xxhash and blake3 (required), lz4 and zstandard (optional,
for compressed payloads).
"""
import base64
import hashlib
import os
import socket
import ssl
import struct
import time

import blake3
import xxhash

try:
    import lz4.block as _lz4block
except ImportError:  # pragma: no cover
    _lz4block = None
try:
    import zstandard as _zstd
except ImportError:  # pragma: no cover
    _zstd = None

# ---------------------------------------------------------------- constants (§14.2)
MAGIC = b"FERRY"
PREAMBLE_VERSION = 1
PREAMBLE_LEN = 8
PROTOCOL_VERSION = 2
MIN_PROTOCOL_VERSION = 2
FRAME_HEADER_LEN = 9
HANDSHAKE_MAX_FRAME = 65536
FRAME_OVERHEAD = 4096
MIN_CHUNK_SIZE = 4096
DEFAULT_CHUNK_SIZE = 1048576
MAX_CHUNK_SIZE = 16777216
MAX_NAME_LEN = 255
MAX_PATH_LEN = 4096
MAX_REQUEST_FRAME = 5127
ATTR_LEN = 95
VERSION_LEN = 52
COMPRESSION_THRESHOLD = 512
ZSTD_MIN_LEVEL, ZSTD_MAX_LEVEL = -7, 22
MAX_ID_NAMES = 1024

TRANSPORT_PLAIN, TRANSPORT_TLS = 0, 1
REFUSALS = {1: "TlsRequired", 2: "TlsUnavailable", 3: "VersionUnsupported", 4: "Busy"}

# feature bits (§6.6)
LZ4 = 1 << 0
HASH = 1 << 1
READ_HASH = 1 << 2
PRIORITY = 1 << 3
DIR_DATA = 1 << 4
ID_NAMES = 1 << 5
DATA_MAP = 1 << 6
XATTRS = 1 << 7
HASH_SPARSE = 1 << 8
ZSTD = 1 << 9
XATTRS_PAGED = 1 << 10
BOUND = 1 << 11
LINK_LIMITS = 1 << 12
TREE = 1 << 13
ALL = (1 << 14) - 1

# message kinds (§14.1)
K_HELLO, K_WELCOME, K_AUTHPROOF, K_AUTHOK = 0x01, 0x02, 0x03, 0x04
K_PING, K_STAT, K_READDIR, K_READ, K_READLINK, K_STATFS, K_HASH = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16
K_READDIRDATA, K_IDNAMES, K_DATAMAP, K_DIRXATTRS, K_HASHSPARSE = 0x17, 0x18, 0x19, 0x1a, 0x1b
K_LOAD, K_DIRXATTRSPAGE, K_READTREE = 0x1c, 0x1d, 0x1e
K_ERROR = 0xff

# status codes (§8)
STATUS = {1: "NotFound", 2: "NotDirectory", 3: "IsDirectory", 4: "PermissionDenied",
          5: "InvalidName", 6: "InvalidArgument", 7: "SymlinkInPath", 8: "Io", 9: "TooLarge",
          10: "Busy", 11: "Unsupported", 12: "AuthFailed", 13: "NameTooLong"}
S = type("S", (), {v: k for k, v in STATUS.items()})

# file kinds (§5.4)
FK_REG, FK_DIR, FK_LNK, FK_FIFO, FK_CHR, FK_BLK, FK_SOCK = range(1, 8)


# ---------------------------------------------------------------- errors
class FerryError(Exception):
    """An Error frame (§7.2)."""

    def __init__(self, status, message, rid=None):
        super().__init__("%s(%d): %s" % (STATUS.get(status, "?"), status, message))
        self.status, self.message, self.rid = status, message, rid


class ProtocolViolation(Exception):
    """A protocol error (§11) detected by this client."""


class Closed(Exception):
    """The peer closed the connection (EOF or reset)."""

    def __init__(self, msg="connection closed", reset=False, partial=b""):
        super().__init__(msg)
        self.reset, self.partial = reset, partial


class Refused(Exception):
    """A preamble refusal (§3.2)."""

    def __init__(self, code):
        super().__init__("refused: %s (%d)" % (REFUSALS.get(code, "VersionUnsupported?"), code))
        self.code = code


class PayloadError(Exception):
    """A payload failed verification (§10.3)."""


class Timeout(Exception):
    pass


# ---------------------------------------------------------------- encoding helpers
def u8(v): return struct.pack(">B", v)
def u16(v): return struct.pack(">H", v)
def u32(v): return struct.pack(">I", v)
def u64(v): return struct.pack(">Q", v)
def i8(v): return struct.pack(">b", v)


def b16(b):
    if isinstance(b, str):
        b = b.encode()
    if len(b) > 65535:
        raise ValueError("bytes16 too long")
    return u16(len(b)) + b


def frame(kind, rid, body=b"", length=None):
    ln = 5 + len(body) if length is None else length
    return u32(ln) + u8(kind) + u32(rid) + body


class Reader:
    def __init__(self, buf):
        self.b, self.p = buf, 0

    def take(self, n):
        if self.p + n > len(self.b):
            raise ProtocolViolation("truncated message (need %d at %d of %d)" % (n, self.p, len(self.b)))
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def u8(self): return self.take(1)[0]
    def i8(self): return struct.unpack(">b", self.take(1))[0]
    def u16(self): return struct.unpack(">H", self.take(2))[0]
    def u32(self): return struct.unpack(">I", self.take(4))[0]
    def u64(self): return struct.unpack(">Q", self.take(8))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]
    def b16(self): return self.take(self.u16())
    def rest(self):
        v = self.b[self.p:]
        self.p = len(self.b)
        return v
    def remaining(self): return len(self.b) - self.p

    def done(self):
        if self.p != len(self.b):
            raise ProtocolViolation("trailing bytes (%d)" % (len(self.b) - self.p))

    def ts(self):
        sec, nsec = self.i64(), self.u32()
        if nsec >= 1000000000:
            raise ProtocolViolation("nsec >= 1e9")
        return (sec, nsec)

    def attr(self):
        start = self.p
        a = {}
        a["ino"] = self.u64()
        a["kind"] = self.u8()
        if not 1 <= a["kind"] <= 7:
            raise ProtocolViolation("file kind %d" % a["kind"])
        a["perm"] = self.u16()
        if a["perm"] > 0o7777:
            raise ProtocolViolation("perm > 0o7777")
        a["nlink"], a["uid"], a["gid"] = self.u32(), self.u32(), self.u32()
        a["rdev"], a["size"], a["blocks"] = self.u64(), self.u64(), self.u64()
        a["atime"], a["mtime"], a["ctime"], a["btime"] = self.ts(), self.ts(), self.ts(), self.ts()
        a["raw"] = self.b[start:self.p]
        return a

    def version(self):
        start = self.p
        v = {"ino": self.u64(), "size": self.u64(), "mtime": self.ts(), "ctime": self.ts(), "btime": self.ts()}
        v["raw"] = self.b[start:self.p]
        return v


def version_of_attr(a):
    return (a["ino"], a["size"], a["mtime"], a["ctime"], a["btime"])


def vkey(v):
    return (v["ino"], v["size"], v["mtime"], v["ctime"], v["btime"])


# ---------------------------------------------------------------- hashing (§6.5, §7.14, §10.3)
def xxh3(b):
    return xxhash.xxh3_64_intdigest(b)


def token_key(token):
    return blake3.blake3(token, derive_key_context="ferry token v1").digest()


def client_proof(token, challenge, nonce):
    return blake3.blake3(b"client" + challenge + nonce, key=token_key(token)).digest()


def server_proof(token, challenge, nonce):
    return blake3.blake3(b"server" + challenge + nonce, key=token_key(token)).digest()


def strip_token(raw):
    return raw.strip(b" \t\n\x0c\r")


def sparse_hash(data):
    """HashSparse of a file's bytes, as §7.14 defines it."""
    h = blake3.blake3()
    size = len(data)
    runs = []  # (is_data, start, end)
    for off in range(0, size, 4096):
        blk = data[off:off + 4096]
        isdata = blk.count(0) != len(blk)
        if runs and runs[-1][0] == isdata:
            runs[-1][2] = off + len(blk)
        else:
            runs.append([isdata, off, off + len(blk)])
    for isdata, s, e in runs:
        if isdata:
            h.update(data[s:e])
            h.update(b"\x01" + u64(e - s))
        else:
            h.update(b"\x00" + u64(e - s))
    h.update(b"\x02" + u64(size))
    return h.digest()


def decode_payload(encoding, data, decoded_len):
    enc = encoding & 0x7f
    if enc == 0:
        if len(data) != decoded_len:
            raise PayloadError("raw length mismatch %d != %d" % (len(data), decoded_len))
        return data
    if enc == 1:
        if _lz4block is None:
            raise PayloadError("lz4 module missing")
        try:
            out = _lz4block.decompress(data, uncompressed_size=decoded_len)
        except Exception as e:
            raise PayloadError("lz4 error: %s" % e)
        if len(out) != decoded_len:
            raise PayloadError("lz4 length mismatch")
        return out
    if enc == 2:
        if _zstd is None:
            raise PayloadError("zstandard module missing")
        try:
            d = _zstd.ZstdDecompressor().decompressobj()
            out = d.decompress(data)
            if not d.eof or d.unused_data:
                raise PayloadError("zstd: incomplete frame or trailing bytes")
        except _zstd.ZstdError as e:
            raise PayloadError("zstd error: %s" % e)
        if len(out) != decoded_len:
            raise PayloadError("zstd length mismatch")
        return out
    raise ProtocolViolation("encoding %d" % enc)


def fingerprint_of_der(der):
    return "SHA256:" + base64.b64encode(hashlib.sha256(der).digest()).decode()


# ---------------------------------------------------------------- transport
class Transport:
    """Plain TCP, or TLS through an SSLObject over MemoryBIOs (so the server's preamble can
    be read in front of its TLS bytes, and the ClientHello can be pipelined)."""

    def __init__(self, sock):
        self.sock = sock
        self.raw = b""  # plain bytes received and not yet consumed
        self.tls = None
        self.inb = self.outb = None

    def settimeout(self, t):
        self.sock.settimeout(t)

    def _sock_recv(self, n=65536):
        try:
            d = self.sock.recv(n)
        except socket.timeout:
            raise Timeout("timed out")
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed("reset: %s" % e, reset=True)
        return d

    def sendall(self, data):
        if self.tls is None:
            try:
                self.sock.sendall(data)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise Closed("reset on send: %s" % e, reset=True)
            except socket.timeout:
                raise Timeout("send timed out")
        else:
            self.tls.write(data)
            self._flush()

    def _flush(self):
        out = self.outb.read()
        if out:
            try:
                self.sock.sendall(out)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise Closed("reset on send: %s" % e, reset=True)

    def recv_raw_exact(self, n):
        while len(self.raw) < n:
            d = self._sock_recv()
            if not d:
                raise Closed("EOF after %d of %d bytes" % (len(self.raw), n), partial=self.raw)
            self.raw += d
        v, self.raw = self.raw[:n], self.raw[n:]
        return v

    def start_tls(self, ctx, server_hostname=None, defer=False):
        self.inb, self.outb = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inb, self.outb, server_side=False, server_hostname=server_hostname)
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        self._flush()  # ClientHello on the wire
        if not defer:
            self.finish_tls()

    def finish_tls(self):
        if self.raw:
            self.inb.write(self.raw)
            self.raw = b""
        while True:
            try:
                self.tls.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                d = self._sock_recv()
                if not d:
                    self.inb.write_eof()
                    try:
                        self.tls.do_handshake()
                    except ssl.SSLError as e:
                        raise Closed("EOF during TLS handshake: %s" % e)
                    raise Closed("EOF during TLS handshake")
                self.inb.write(d)

    def recv_some(self):
        if self.tls is None:
            if self.raw:
                d, self.raw = self.raw, b""
                return d
            d = self._sock_recv()
            if not d:
                raise Closed("EOF")
            return d
        while True:
            try:
                d = self.tls.read(65536)
                if not d:
                    raise Closed("TLS EOF")
                return d
            except ssl.SSLWantReadError:
                self._flush()
                d = self._sock_recv()
                if not d:
                    self.inb.write_eof()
                    continue
                self.inb.write(d)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                raise Closed("TLS closed")
            except ssl.SSLError as e:
                raise Closed("TLS error: %s" % e)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def make_tls_context(ca=None, fingerprint=None, cert=None, key=None, min_version=None,
                     max_version=None, check_hostname=True):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca:
        ctx.load_verify_locations(ca)
        ctx.check_hostname = check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        # pinning: no chain or name checks; the pin is compared after the handshake
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert, key)
    if min_version:
        ctx.minimum_version = min_version
    if max_version:
        ctx.maximum_version = max_version
    return ctx


def _is_ip(host):
    for fam in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(fam, host)
            return True
        except OSError:
            pass
    return False


# ---------------------------------------------------------------- connection
class Conn:
    def __init__(self, host, port, timeout=10.0, bind=None):
        self.host, self.port = host, port
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        if bind:
            s.bind((bind, 0))
        s.settimeout(timeout)
        s.connect((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.t = Transport(s)
        self.buf = b""
        self.limit = HANDSHAKE_MAX_FRAME
        self.welcome = None
        self.features = 0
        self.next_id = 1
        self.pending = {}  # rid -> (kind, request info)
        self.stash = {}  # rid -> list of frames received
        self.peer_cert = None
        self.tls_version = None

    # -- low level
    def settimeout(self, t):
        self.t.settimeout(t)

    def send(self, data):
        self.t.sendall(data)

    def send_frame(self, kind, rid, body=b""):
        self.t.sendall(frame(kind, rid, body))

    def recv_frame(self):
        while True:
            if len(self.buf) >= 4:
                ln = struct.unpack(">I", self.buf[:4])[0]
                if ln < 5:
                    raise ProtocolViolation("TooShort frame length %d" % ln)
                if ln > self.limit:
                    raise ProtocolViolation("TooLarge frame length %d > %d" % (ln, self.limit))
                if len(self.buf) >= 4 + ln:
                    f = self.buf[4:4 + ln]
                    self.buf = self.buf[4 + ln:]
                    return f[0], struct.unpack(">I", f[1:5])[0], f[5:]
            self.buf += self.t.recv_some()

    def expect_close(self, timeout=5.0):
        """Read until the peer closes; returns (frames received meanwhile, how, seconds).
        how: 'eof', 'reset' or 'timeout'."""
        t0 = time.monotonic()
        frames = []
        self.settimeout(0.2)
        while True:
            if time.monotonic() - t0 > timeout:
                return frames, "timeout", time.monotonic() - t0
            try:
                frames.append(self.recv_frame())
            except Timeout:
                continue
            except Closed as e:
                return frames, ("reset" if e.reset else "eof"), time.monotonic() - t0
            except ProtocolViolation as e:
                frames.append(("violation", str(e)))
                return frames, "violation", time.monotonic() - t0

    def close(self):
        self.t.close()

    # -- preamble (§3)
    def preamble(self, transport=TRANSPORT_PLAIN, raw=None, then=b""):
        """Send our preamble (and optionally bytes right behind it), read the server's."""
        self.t.sendall((raw if raw is not None else MAGIC + bytes([PREAMBLE_VERSION, transport, 0])) + then)
        return self.read_server_preamble()

    def read_server_preamble(self):
        p = self.t.recv_raw_exact(8)
        if p[:5] != MAGIC:
            raise ProtocolViolation("server preamble magic %r" % p[:5])
        if p[6] == 0xff:
            raise Refused(p[7])
        if p[6] not in (0, 1):
            raise ProtocolViolation("malformed server preamble %r" % p)
        return p

    def start_tls(self, ca=None, fingerprint=None, cert=None, key=None, min_version=None,
                  max_version=None, server_hostname="auto", check_hostname=True):
        ctx = make_tls_context(ca, fingerprint, cert, key, min_version, max_version, check_hostname)
        if server_hostname == "auto":
            # §3.4: SNI is the host name; none when connecting by IP address (Python's ssl
            # module itself never sends an IP address as SNI)
            server_hostname = self.host
        self.t.start_tls(ctx, server_hostname=server_hostname)
        self._after_tls(fingerprint)

    def _after_tls(self, fingerprint):
        der = self.t.tls.getpeercert(binary_form=True)
        self.peer_cert = der
        self.tls_version = self.t.tls.version()
        if fingerprint is not None and fingerprint_of_der(der) != fingerprint:
            raise ssl.SSLError("the server's certificate is %s, not the one pinned" % fingerprint_of_der(der))

    # -- handshake (§6)
    def hello_body(self, version=PROTOCOL_VERSION, features=ALL, chunk_size=DEFAULT_CHUNK_SIZE,
                   name="ferry_spec 0.1 conformance"):
        return u16(version) + u64(features) + u32(chunk_size) + b16(name)

    def send_hello(self, **kw):
        self.hello_features = kw.get("features", ALL)
        self.send_frame(K_HELLO, 0, self.hello_body(**kw))

    def handshake_frame(self, want, what):
        """The next handshake frame, of kind `want`: an Error frame raises FerryError, any
        other kind is a protocol violation. Returns (request id, body)."""
        kind, rid, body = self.recv_frame()
        if kind == K_ERROR:
            st, msg = parse_error(body)
            raise FerryError(st, msg, rid)
        if kind != want:
            raise ProtocolViolation("expected %s, got kind 0x%02x" % (what, kind))
        return rid, body

    def read_welcome(self):
        rid, body = self.handshake_frame(K_WELCOME, "Welcome")
        r = Reader(body)
        w = {"version": r.u16(), "features": r.u64(), "chunk_size": r.u32(), "max_frame": r.u32(),
             "max_inflight": r.u32(), "instance_id": r.take(16), "auth_method": r.u8(), "rid": rid,
             "len": len(body)}
        if w["auth_method"] not in (0, 1):
            raise ProtocolViolation("auth method %d" % w["auth_method"])
        w["challenge"] = r.take(32) if w["auth_method"] == 1 else None
        w["zstd_max_level"] = None
        if w["features"] & ZSTD:
            w["zstd_max_level"] = r.i8()
            if not ZSTD_MIN_LEVEL <= w["zstd_max_level"] <= ZSTD_MAX_LEVEL:
                raise ProtocolViolation("zstd_max_level out of range")
        r.done()
        return w

    def check_welcome(self, w, token=None):
        # §6.2 client checks
        if w["version"] < MIN_PROTOCOL_VERSION:
            raise ProtocolViolation("server version %d too old" % w["version"])
        if not MIN_CHUNK_SIZE <= w["chunk_size"] <= MAX_CHUNK_SIZE:
            raise ProtocolViolation("chunk_size out of range")
        if w["max_frame"] < w["chunk_size"] + 256 or w["max_frame"] > MAX_CHUNK_SIZE + FRAME_OVERHEAD:
            raise ProtocolViolation("max_frame out of range")
        if w["max_inflight"] == 0:
            raise ProtocolViolation("max_inflight 0")
        if token is not None and w["auth_method"] == 0:
            raise ProtocolViolation("server did not ask for the token")
        if token is None and w["auth_method"] == 1:
            raise ProtocolViolation("server requires a token and none was given")

    def auth(self, token, nonce=None, proof=None):
        w = self.welcome
        nonce = nonce if nonce is not None else os.urandom(32)
        if proof is None:
            proof = client_proof(token, w["challenge"], nonce)
        self.send_frame(K_AUTHPROOF, 0, nonce + proof)
        _, body = self.handshake_frame(K_AUTHOK, "AuthOk")
        if len(body) != 32:
            raise ProtocolViolation("AuthOk body %d" % len(body))
        if not hmac_eq(body, server_proof(token, w["challenge"], nonce)):
            raise ProtocolViolation("server proof wrong")
        return body

    def handshake(self, token=None, check=True, **hello):
        self.send_hello(**hello)
        w = self.read_welcome()
        self.welcome = w
        if check:
            self.check_welcome(w, token)
        self.features = w["features"]
        if w["auth_method"] == 1 and token is not None:
            self.auth(token)
        self.limit = w["max_frame"]
        return w

    # -- requests (§7)
    def alloc_id(self):
        rid = self.next_id
        self.next_id = self.next_id + 1 if self.next_id < 0xffffffff else 1
        return rid

    def send_request(self, kind, body, rid=None):
        rid = self.alloc_id() if rid is None else rid
        self.send_frame(kind, rid, body)
        return rid

    def wait(self, rid):
        """Frames for other ids are stashed."""
        if self.stash.get(rid):
            return self.stash[rid].pop(0)
        while True:
            kind, r, body = self.recv_frame()
            if r == rid:
                return kind, body
            self.stash.setdefault(r, []).append((kind, body))

    def call(self, kind, body):
        rid = self.send_request(kind, body)
        rk, rb = self.wait(rid)
        return rid, rk, rb

    def request(self, kind, body):
        """Sends one request and returns a Reader over its success response's body
        (an Error response raises FerryError, another kind is a protocol violation)."""
        rid, rk, rb = self.call(kind, body)
        return self._result(kind, rk, rb, rid)

    def _result(self, kind, rk, rb, rid):
        if rk == K_ERROR:
            st, msg = parse_error(rb)
            raise FerryError(st, msg, rid)
        if rk != kind | 0x80:
            raise ProtocolViolation("wrong answer kind 0x%02x to 0x%02x" % (rk, kind))
        return Reader(rb)

    def ping(self):
        r = self.request(K_PING, b"")
        r.done()
        return True

    def stat(self, path):
        r = self.request(K_STAT, b16(path))
        a = r.attr()
        r.done()
        return a

    def readdir_page(self, path, cookie=0, max_entries=128):
        rid, rk, rb = self.call(K_READDIR, b16(path) + u64(cookie) + u32(max_entries))
        r = self._result(K_READDIR, rk, rb, rid)
        return parse_dirpage(r, len(rb))

    def readdir(self, path, max_entries=4096, max_pages=100000):
        out, cookie, pages = [], 0, 0
        while True:
            eof, ents = self.readdir_page(path, cookie, max_entries)
            pages += 1
            out.extend(ents)
            if eof:
                return out, pages
            if not ents:
                raise ProtocolViolation("empty page without eof")
            cookie = ents[-1]["cookie"]
            if pages > max_pages:
                raise ProtocolViolation("too many pages")

    def read_raw(self, path, offset, length, flags=0, level=None, rid=None):
        body = b16(path) + u64(offset) + u32(length) + u8(flags)
        if level is not None:
            body += i8(level)
        rid = self.send_request(K_READ, body, rid)
        rk, rb = self.wait(rid)
        return rid, rk, rb

    def read(self, path, offset=0, length=None, lz4=False, zstd_level=None, klass=0):
        length = self.welcome["chunk_size"] if length is None else length
        flags = (1 if lz4 else 0) | (klass << 1) | (8 if zstd_level is not None else 0)
        rid, rk, rb = self.read_raw(path, offset, length, flags, zstd_level)
        r = self._result(K_READ, rk, rb, rid)
        return self.parse_read(r, rid, path, offset, length)

    def parse_read(self, r, rid, path, offset, length):
        ver = r.version()
        enc = r.u8()
        if (enc & 0x7f) not in (0, 1, 2):
            raise ProtocolViolation("encoding %d" % enc)
        dlen = r.u32()
        csum = r.u64()
        fh = r.take(32) if enc & 0x80 else None
        data = r.rest()
        if dlen > length:
            raise PayloadError("decoded_len %d > len %d" % (dlen, length))
        dec = decode_payload(enc, data, dlen)
        expect = xxh3(dec)
        if self.features & BOUND:
            bind = u32(rid) + u64(offset) + u32(length) + b16(path) + ver["raw"] + u8(enc) + u32(dlen)
            if fh is not None:
                bind += fh
            expect ^= xxh3(bind)
        if expect != csum:
            raise PayloadError("checksum mismatch")
        return {"version": ver, "encoding": enc, "decoded_len": dlen, "file_hash": fh, "data": dec,
                "wire_len": len(data)}

    def read_file(self, path, chunk=None, **kw):
        chunk = chunk or self.welcome["chunk_size"]
        out, off, vers = [], 0, set()
        while True:
            res = self.read(path, off, chunk, **kw)
            vers.add(vkey(res["version"]))
            out.append(res["data"])
            off += res["decoded_len"]
            if res["decoded_len"] < chunk or off >= res["version"]["size"]:
                break
        return b"".join(out), vers

    def readlink(self, path):
        r = self.request(K_READLINK, b16(path))
        t = r.b16()
        r.done()
        return t

    def statfs(self):
        r = self.request(K_STATFS, b"")
        v = {k: r.u64() for k in ("blocks", "bfree", "bavail", "files", "ffree")}
        v.update({k: r.u32() for k in ("bsize", "namelen", "frsize")})
        r.done()
        return v

    def hash(self, path, kind=K_HASH):
        r = self.request(kind, b16(path))
        v = r.version()
        h = r.take(32)
        r.done()
        return v, h

    def hash_sparse(self, path):
        return self.hash(path, K_HASHSPARSE)

    def readdirdata_page(self, path, cookie=0, max_entries=128, max_file=65536, lz4=False,
                         zstd_level=None, klass=0):
        flags = (1 if lz4 else 0) | (klass << 1) | (8 if zstd_level is not None else 0)
        body = b16(path) + u64(cookie) + u32(max_entries) + u32(max_file) + u8(flags)
        if zstd_level is not None:
            body += i8(zstd_level)
        rid, rk, rb = self.call(K_READDIRDATA, body)
        r = self._result(K_READDIRDATA, rk, rb, rid)
        eof, count = page_header(r, 106)
        ents = []
        for _ in range(count):
            e = {"name": r.b16(), "cookie": r.u64(), "attr": r.attr()}
            hd = r.u8()
            if hd not in (0, 1):
                raise ProtocolViolation("has_data %d" % hd)
            e["data"] = None
            if hd:
                enc, dlen, csum, b3 = r.u8(), r.u32(), r.u64(), r.take(32)
                data = r.take(r.u32())
                if enc not in (0, 1, 2):
                    raise ProtocolViolation("encoding %d" % enc)
                dec = decode_payload(enc, data, dlen)
                expect = xxh3(dec)
                if self.features & BOUND:
                    bind = u32(rid) + u64(cookie) + b16(path) + b16(e["name"]) + e["attr"]["raw"] + u8(enc) + u32(dlen) + b3
                    expect ^= xxh3(bind)
                if expect != csum:
                    raise PayloadError("DirData checksum mismatch for %r" % e["name"])
                e.update(encoding=enc, decoded_len=dlen, blake3=b3, data=dec, wire_len=len(data))
            ents.append(e)
        r.done()
        return eof, ents

    def idnames(self, pairs, count=None):
        body = u16(len(pairs) if count is None else count) + b"".join(u8(k) + u32(i) for k, i in pairs)
        r = self.request(K_IDNAMES, body)
        n = r.u16()
        out = [(r.u8(), r.u32(), r.b16()) for _ in range(n)]
        r.done()
        return out

    def datamap(self, path, offset=0, max_extents=4096):
        r = self.request(K_DATAMAP, b16(path) + u64(offset) + u32(max_extents))
        v = r.version()
        nxt, count = r.u64(), r.u32()
        if count * 16 > r.remaining():
            raise ProtocolViolation("count beyond body")
        ext = [(r.u64(), r.u64()) for _ in range(count)]
        r.done()
        return v, nxt, ext

    def _xattr_entries(self, r):
        count = r.u32()
        out = {}
        for _ in range(count):
            name = r.b16()
            n = r.u16()
            attrs = {}
            for _ in range(n):
                an = r.b16()
                attrs[an] = r.take(r.u32())
            out[name] = attrs
        r.done()
        return out, count

    def dirxattrs(self, path):
        r = self.request(K_DIRXATTRS, b16(path))
        return self._xattr_entries(r)[0]

    def dirxattrs_page(self, path, cookie=0):
        rid, rk, rb = self.call(K_DIRXATTRSPAGE, b16(path) + u64(cookie))
        r = self._result(K_DIRXATTRSPAGE, rk, rb, rid)
        nxt = r.u64()
        ents, _ = self._xattr_entries(r)
        return nxt, ents, len(rb)

    def load(self):
        rid, rk, rb = self.call(K_LOAD, b"")
        r = self._result(K_LOAD, rk, rb, rid)
        v = {"cores": r.u16(), "idle_permille": r.u32(), "process_permille": r.u32(), "boot_id": r.take(16)}
        if self.features & LINK_LIMITS:
            v["sending_micros"], v["limited_micros"] = r.u64(), r.u64()
        r.done()
        v["len"] = len(rb)
        return v

    def readtree(self, path, max_entries=16384):
        r = self.request(K_READTREE, b16(path) + u32(max_entries))
        count = r.u32()
        listings = []
        for _ in range(count):
            rel = r.b16()
            eof, n = page_header(r, 105)
            ents = [{"name": r.b16(), "cookie": r.u64(), "attr": r.attr()} for _ in range(n)]
            listings.append({"rel": rel, "eof": eof, "entries": ents})
        r.done()
        return listings


def hmac_eq(a, b):
    import hmac
    return hmac.compare_digest(a, b)


def parse_error(body):
    r = Reader(body)
    st = r.u16()
    msg = r.b16()
    r.done()
    if st == 0 or st not in STATUS:
        raise ProtocolViolation("invalid status %d in Error" % st)
    return st, msg.decode("utf-8", "replace")


def page_header(r, min_entry):
    """A page's `eof` (0 or 1) and entry count (each entry at least `min_entry` bytes)."""
    eof = r.u8()
    if eof not in (0, 1):
        raise ProtocolViolation("eof %d" % eof)
    count = r.u32()
    if count * min_entry > r.remaining():
        raise ProtocolViolation("count beyond body")
    return eof, count


def parse_dirpage(r, blen=None):
    eof, count = page_header(r, 105)
    ents = []
    for _ in range(count):
        ents.append({"name": r.b16(), "cookie": r.u64(), "attr": r.attr()})
    r.done()
    return eof, ents


def connect(host, port, tls=None, token=None, pipelined=True, timeout=10.0, bind=None, **hello):
    """Open a connection and complete the handshake. tls: dict of Conn.start_tls arguments."""
    c = Conn(host, port, timeout=timeout, bind=bind)
    try:
        if tls is None:
            if pipelined:
                c.t.sendall(MAGIC + bytes([1, 0, 0]) + frame(K_HELLO, 0, c.hello_body(**hello)))
                c.hello_features = hello.get("features", ALL)
                p = c.read_server_preamble()
                if p[6] != 0:
                    raise ProtocolViolation("transport not echoed")
                w = c.read_welcome()
                c.welcome = w
                c.check_welcome(w, token)
                c.features = w["features"]
                if w["auth_method"] == 1:
                    c.auth(token)
                c.limit = w["max_frame"]
            else:
                c.preamble(TRANSPORT_PLAIN)
                c.handshake(token=token, **hello)
        else:
            tls = dict(tls)
            fp = tls.get("fingerprint")
            if pipelined:
                c.t.sendall(MAGIC + bytes([1, 1, 0]))
                ctx = make_tls_context(**{k: v for k, v in tls.items() if k not in ("server_hostname",)})
                sh = tls.get("server_hostname", "auto")
                sh = host if sh == "auto" else sh
                c.t.start_tls(ctx, server_hostname=sh, defer=True)
                p = c.read_server_preamble()
                if p[6] != 1:
                    raise ProtocolViolation("transport not echoed")
                c.t.finish_tls()
                c._after_tls(fp)
            else:
                c.preamble(TRANSPORT_TLS)
                c.start_tls(**tls)
            c.handshake(token=token, **hello)
        return c
    except BaseException:
        c.close()
        raise
