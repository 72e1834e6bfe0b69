#!/usr/bin/env python3
"""Generate sample data sets for ferry demos, benchmarks and tests.

    gen-data.py OUTDIR [--size-mib N] [--small-files N] [--only db,mixed,random,tree,dbdir] [--seed S]

Data sets written into OUTDIR:

  db.dat      N MiB of 8 KiB pages shaped like PostgreSQL heap pages of a pgbench_accounts
              table (page header, line pointers, tuple headers, aid/bid/abalance/filler rows).
              Compresses with `lz4 -1` about like a real table does (ratio ~6-8).
  mixed.bin   N MiB of real files from /usr/lib and /usr/share (ELF objects, text, data,
              already-compressed files) interleaved in a fixed order; `lz4 -1` ratio ~2.
  random.bin  N MiB of seeded pseudo-random, incompressible bytes.
  tree/       --small-files files of 0-64 KiB copied from /usr/include, ~100 per directory,
              three levels deep, plus symlinks (relative, absolute, dangling) and empty
              directories.
  dbdir/      (only when asked for) a PostgreSQL-like data directory of about N MiB: eight
              table segment files of database pages in base/16384/, 300 small catalog-like
              files in base/1/, and a few text files; for whole-directory copies.

The output is deterministic for a given seed (mixed.bin and tree/ depend on the files installed
on the machine, read in sorted order). Reruns skip outputs that already exist with the right size
(tree/: with a matching stamp file, OUTDIR/.tree.stamp), so they are fast. Files are written to a
temporary name and renamed into place, so an interrupted run never leaves a complete-looking file.

Python 3.9+ standard library only.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import stat
import struct
import sys
import time
from array import array

MIB = 1 << 20
ALL_SETS = ("db", "mixed", "random", "tree", "dbdir")
DEFAULT_SETS = ("db", "mixed", "random", "tree")
DBDIR_VERSION = 1


class GenError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# ----------------------------------------------------------------------------------------------
# db.dat: PostgreSQL-like heap pages of pgbench_accounts
# ----------------------------------------------------------------------------------------------
#
# Page (8192 bytes), as in PostgreSQL's bufpage.h / htup_details.h, little-endian:
#   0  pd_lsn (xlogid u32, xrecoff u32)   8  pd_checksum u16   10 pd_flags u16
#   12 pd_lower u16   14 pd_upper u16     16 pd_special u16    18 pd_pagesize_version u16
#   20 pd_prune_xid u32
#   24 ItemIdData[61]: lp_off:15 | lp_flags:2 | lp_len:15
#   free space (zeros) up to pd_upper, then the tuples, filled from the end of the page:
#   tuple k (1-based) at 8192 - 128*k, 121 bytes + 7 bytes MAXALIGN padding:
#     0  t_xmin u32   4 t_xmax u32   8 t_cid u32   12 t_ctid (bi_hi u16, bi_lo u16, posid u16)
#     18 t_infomask2 u16   20 t_infomask u16   22 t_hoff u8 (=24)   23 pad
#     24 aid int4   28 bid int4   32 abalance int4
#     36 filler char(84): 1-byte varlena header (0xAB = (85 << 1) | 1) + 84 bytes, blank-padded
# 61 tuples per page, as pgbench gets with fillfactor 100.
#
# Speed: a 1 MiB batch (128 pages) is a template copied into an array of u32 words; every tuple
# field sits at a word offset with stride 32 words (128 bytes) across the whole batch, so each
# varying field is one extended-slice assignment per batch. The stride also hits 3 slots per page
# inside the header/line-pointer area; those 96 words are rewritten per page afterwards.

PAGE_SIZE = 8192
TUPLE_SPACE = 128  # MAXALIGN(121)
TUPLE_LEN = 121
TUPLES_PER_PAGE = 61
WORDS_PER_PAGE = PAGE_SIZE // 4
SLOT_STRIDE = TUPLE_SPACE // 4  # 32 words
SLOTS_PER_PAGE = WORDS_PER_PAGE // SLOT_STRIDE  # 64; slot j holds tuple k = 64 - j (j >= 3)
HEADER_WORDS = (PAGE_SIZE - TUPLES_PER_PAGE * TUPLE_SPACE) // 4  # 96: header + lp + free space
PAGES_PER_BATCH = MIB // PAGE_SIZE  # 128
ROWS_PER_BRANCH = 100_000  # pgbench: bid = (aid - 1) / 100000 + 1

PD_LOWER = 24 + 4 * TUPLES_PER_PAGE  # 268
PD_UPPER = PAGE_SIZE - TUPLES_PER_PAGE * TUPLE_SPACE  # 384
PD_ALL_VISIBLE = 0x0004
PAGESIZE_VERSION = PAGE_SIZE | 4
LP_NORMAL = 1

# infomask bits
HEAP_HASVARWIDTH = 0x0002
HEAP_XMIN_COMMITTED = 0x0100
HEAP_XMIN_INVALID = 0x0200
HEAP_XMAX_COMMITTED = 0x0400
HEAP_XMAX_INVALID = 0x0800
HEAP_UPDATED = 0x2000
# infomask2 bits
NATTS = 4
HEAP_HOT_UPDATED = 0x4000
HEAP_ONLY_TUPLE = 0x8000

XMIN_LOAD = 731  # the transaction that loaded the table (pgbench -i)
XMIN_RUN_BASE = 1_000_000  # transactions of the pgbench run that updated rows
XMIN_RUN_SPAN = 1 << 20

# Row states, drawn per row from 8 random bits (out of 256):
ROWS_UPDATED = 40  # new row version written by the run: new xmin, random abalance, heap-only
ROWS_DEAD = 12  # old version not yet vacuumed: xmax set, HOT-updated


def _db_template_page() -> bytes:
    page = bytearray(PAGE_SIZE)
    struct.pack_into(
        "<HHHHHHI", page, 8, 0, 0, PD_LOWER, PD_UPPER, PAGE_SIZE, PAGESIZE_VERSION, 0
    )
    for k in range(1, TUPLES_PER_PAGE + 1):
        off = PAGE_SIZE - TUPLE_SPACE * k
        struct.pack_into("<I", page, 24 + 4 * (k - 1), off | (LP_NORMAL << 15) | (TUPLE_LEN << 17))
        infomask = HEAP_XMIN_COMMITTED | HEAP_XMAX_INVALID | HEAP_HASVARWIDTH
        struct.pack_into("<IIIHHHHHB", page, off, XMIN_LOAD, 0, 0, 0, 0, k, NATTS, infomask, 24)
        page[off + 36] = (85 << 1) | 1
        page[off + 37 : off + 37 + 84] = b" " * 84
    return bytes(page)


class DbGenerator:
    def __init__(self, seed: int):
        self.rng = random.Random(f"{seed}/db.dat")
        template = _db_template_page()
        self.batch_template = template * PAGES_PER_BATCH
        tmpl_words = array("I")
        tmpl_words.frombytes(template[: HEADER_WORDS * 4])
        if sys.byteorder != "little":
            tmpl_words.byteswap()
        # Header words 6..95 (line pointers, free space) are the same on every page.
        self.header_tail = tmpl_words[6:HEADER_WORDS]
        n = PAGES_PER_BATCH * SLOTS_PER_PAGE
        # Per-slot constants for one batch: tuple number k and row offset from the batch's first aid.
        self.slot_k = [SLOTS_PER_PAGE - (s % SLOTS_PER_PAGE) for s in range(n)]
        self.slot_row = [
            (s // SLOTS_PER_PAGE) * TUPLES_PER_PAGE + self.slot_k[s] for s in range(n)
        ]
        self.lsn = (0x3 << 32) | 0x1A000028
        self.page_no = 0

    def batch(self) -> bytes:
        """Next 1 MiB (128 pages)."""
        rng = self.rng
        n = PAGES_PER_BATCH * SLOTS_PER_PAGE
        words = array("I")
        words.frombytes(self.batch_template)
        if sys.byteorder != "little":
            words.byteswap()
        first_page = self.page_no
        aid0 = first_page * TUPLES_PER_PAGE
        rnd = array("Q")
        rnd.frombytes(rng.randbytes(n * 8))

        up_lim = ROWS_UPDATED
        dead_lim = ROWS_UPDATED + ROWS_DEAD
        xmin_load = XMIN_LOAD
        run_base = XMIN_RUN_BASE
        run_mask = XMIN_RUN_SPAN - 1

        aid = array("I", [aid0 + r for r in self.slot_row])
        first_bid = aid0 // ROWS_PER_BRANCH + 1
        last_bid = (aid0 + PAGES_PER_BATCH * TUPLES_PER_PAGE - 1) // ROWS_PER_BRANCH + 1
        if first_bid == last_bid:
            bid = array("I", [first_bid]) * n
        else:
            bid = array("I", [(a - 1) // ROWS_PER_BRANCH + 1 for a in aid])
        # xmin: loader's xid, or a run xid for new and dead versions.
        xmin = array(
            "I",
            [xmin_load if (r & 0xFF) >= dead_lim else run_base + ((r >> 8) & run_mask) for r in rnd],
        )
        # xmax: set on dead versions only.
        xmax = array(
            "I",
            [
                run_base + ((r >> 12) & run_mask) + 1 if up_lim <= (r & 0xFF) < dead_lim else 0
                for r in rnd
            ],
        )
        # abalance: 0 after load; updated rows carry a balance in -5000..5000 (as int4 bits).
        abal = array(
            "I",
            [((r >> 32) % 10001 - 5000) & 0xFFFFFFFF if (r & 0xFF) < dead_lim else 0 for r in rnd],
        )
        # word 4: ctid posid | infomask2 << 16 ; word 5: infomask | t_hoff << 16
        im_load = HEAP_XMIN_COMMITTED | HEAP_XMAX_INVALID | HEAP_HASVARWIDTH
        im_new = HEAP_XMIN_COMMITTED | HEAP_XMAX_INVALID | HEAP_UPDATED | HEAP_HASVARWIDTH
        im_dead = HEAP_XMIN_COMMITTED | HEAP_XMAX_COMMITTED | HEAP_HASVARWIDTH
        w5_load, w5_new, w5_dead = (im | (24 << 16) for im in (im_load, im_new, im_dead))
        w4 = array(
            "I",
            [
                k | ((NATTS | HEAP_ONLY_TUPLE) << 16)
                if (r & 0xFF) < up_lim
                else k | ((NATTS | HEAP_HOT_UPDATED) << 16)
                if (r & 0xFF) < dead_lim
                else k | (NATTS << 16)
                for r, k in zip(rnd, self.slot_k)
            ],
        )
        w5 = array(
            "I",
            [
                w5_new if (r & 0xFF) < up_lim else w5_dead if (r & 0xFF) < dead_lim else w5_load
                for r in rnd
            ],
        )
        # ctid block number: bi_hi | bi_lo << 16, the page's own number.
        ctid = array("I")
        for p in range(PAGES_PER_BATCH):
            g = first_page + p
            ctid.extend(array("I", [(g >> 16) | ((g & 0xFFFF) << 16)]) * SLOTS_PER_PAGE)

        words[0::SLOT_STRIDE] = xmin
        words[1::SLOT_STRIDE] = xmax
        words[3::SLOT_STRIDE] = ctid
        words[4::SLOT_STRIDE] = w4
        words[5::SLOT_STRIDE] = w5
        words[6::SLOT_STRIDE] = aid
        words[7::SLOT_STRIDE] = bid
        words[8::SLOT_STRIDE] = abal

        # Page headers: LSN grows, checksum looks random, all-visible pages have no prune xid.
        tail = self.header_tail
        for p in range(PAGES_PER_BATCH):
            self.lsn += 0x28 + rng.getrandbits(14)
            checksum = rng.getrandbits(16)
            if rng.getrandbits(2):
                flags, prune = PD_ALL_VISIBLE, 0
            else:
                flags, prune = 0, XMIN_RUN_BASE + rng.getrandbits(20)
            hdr = array(
                "I",
                [
                    self.lsn >> 32,
                    self.lsn & 0xFFFFFFFF,
                    checksum | (flags << 16),
                    PD_LOWER | (PD_UPPER << 16),
                    PAGE_SIZE | (PAGESIZE_VERSION << 16),
                    prune,
                ],
            )
            hdr.extend(tail)
            base = p * WORDS_PER_PAGE
            words[base : base + HEADER_WORDS] = hdr
        self.page_no += PAGES_PER_BATCH
        if sys.byteorder != "little":
            words.byteswap()
        return words.tobytes()


def gen_db(path: str, size_mib: int, seed: int) -> None:
    gen = DbGenerator(seed)
    with AtomicFile(path) as f:
        for _ in range(size_mib):
            f.write(gen.batch())


def gen_dbdir(path: str, size_mib: int, seed: int) -> tuple[int, int]:
    """A PostgreSQL-like data directory: (files, bytes)."""
    if os.path.lexists(path):
        shutil.rmtree(path)
    tmp = path + ".tmp"
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    rng = random.Random(seed)
    files = nbytes = 0
    table = os.path.join(tmp, "base", "16384")
    catalog = os.path.join(tmp, "base", "1")
    os.makedirs(table)
    os.makedirs(catalog)
    os.makedirs(os.path.join(tmp, "pg_wal"))
    per = max(1, size_mib // 8)
    for i in range(8):
        gen = DbGenerator(seed + 100 + i)
        with open(os.path.join(table, str(16400 + i)), "wb") as f:
            for _ in range(per):
                f.write(gen.batch())
        files += 1
        nbytes += per * MIB
    gen = DbGenerator(seed + 99)
    pool = b"".join(gen.batch() for _ in range(2))
    for i in range(300):
        size = 8192 * rng.randint(1, 32)
        start = 8192 * rng.randint(0, (len(pool) - size) // 8192)
        with open(os.path.join(catalog, str(1200 + i)), "wb") as f:
            f.write(pool[start:start + size])
        files += 1
        nbytes += size
    for name, text in (("PG_VERSION", "16\n"), ("postgresql.conf", "shared_buffers = 128MB\n" * 40)):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
        files += 1
        nbytes += len(text)
    os.rename(tmp, path)
    return files, nbytes


# ----------------------------------------------------------------------------------------------
# mixed.bin: real files interleaved by kind
# ----------------------------------------------------------------------------------------------

MIXED_ROOTS = ("/usr/lib", "/usr/share")
# Share of the output per kind of file. With lz4 -1, ELF objects compress ~1.5x, text and other
# data ~3x, packed files (gzip, xz, png, zip, ...) not at all; this mix lands near 2.
MIXED_WEIGHTS = {"elf": 4, "other": 5, "packed": 1}
MIXED_PIECE = 4 * MIB  # at most this much of one file per turn, so no file dominates
PACKED_MAGIC = (
    b"\x1f\x8b",  # gzip
    b"\xfd7zXZ",  # xz
    b"BZh",  # bzip2
    b"\x28\xb5\x2f\xfd",  # zstd
    b"PK\x03\x04",  # zip, jar
    b"\x89PNG",  # png
    b"\xff\xd8\xff",  # jpeg
    b"GIF8",  # gif
    b"wOF",  # woff/woff2
    b"\x04\x22\x4d\x18",  # lz4
)


def _classify(path: str) -> tuple[str, int] | None:
    """(kind, size) of a regular, readable, non-empty file; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None
        head = os.read(fd, 8)
    except OSError:
        return None
    finally:
        os.close(fd)
    if head.startswith(b"\x7fELF"):
        return "elf", st.st_size
    if head.startswith(PACKED_MAGIC):
        return "packed", st.st_size
    return "other", st.st_size


def _walk_files(roots):
    """Paths of regular files under roots in a fixed order (entries sorted by name; a
    directory's files before its subdirectories); symlinks are not followed."""
    for root in roots:
        stack = [root]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            subdirs = []
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        yield e.path
                except OSError:
                    continue
            stack.extend(reversed(subdirs))


def gen_mixed(path: str, size_mib: int, _seed: int) -> None:
    target = size_mib * MIB
    # Collect enough files of each kind for its share (a kind may come up short: then cycle).
    pools: dict[str, list[tuple[str, int]]] = {k: [] for k in MIXED_WEIGHTS}
    have = {k: 0 for k in MIXED_WEIGHTS}
    total_w = sum(MIXED_WEIGHTS.values())
    need = {k: target * w // total_w + MIXED_PIECE for k, w in MIXED_WEIGHTS.items()}
    for p in _walk_files(MIXED_ROOTS):
        if all(have[k] >= need[k] for k in need):
            break
        info = _classify(p)
        if info is None or have[info[0]] >= need[info[0]]:
            continue
        kind, size = info
        pools[kind].append((p, size))
        have[kind] += min(size, MIXED_PIECE)
    kinds = [k for k in MIXED_WEIGHTS if pools[k]]
    if not kinds:
        raise GenError(f"mixed.bin: no readable files under {' and '.join(MIXED_ROOTS)}")

    # Interleave: the kind furthest below its share goes next (deterministic tie-break by order).
    taken = {k: 0 for k in kinds}
    index = {k: 0 for k in kinds}
    written = 0
    with AtomicFile(path) as out:
        while written < target:
            kind = min(kinds, key=lambda k: taken[k] / MIXED_WEIGHTS[k])
            pool = pools[kind]
            fpath, _ = pool[index[kind] % len(pool)]
            index[kind] += 1
            want = min(MIXED_PIECE, target - written)
            try:
                with open(fpath, "rb") as f:
                    data = f.read(want)
            except OSError:
                data = b""
            if not data:
                # Unreadable now: count it so the loop cannot spin on an empty pool.
                taken[kind] += 1
                continue
            out.write(data)
            written += len(data)
            taken[kind] += len(data)


# ----------------------------------------------------------------------------------------------
# random.bin
# ----------------------------------------------------------------------------------------------


def gen_random(path: str, size_mib: int, seed: int) -> None:
    rng = random.Random(f"{seed}/random.bin")
    with AtomicFile(path) as f:
        for _ in range(size_mib):
            f.write(rng.randbytes(MIB))


# ----------------------------------------------------------------------------------------------
# tree/: many small files
# ----------------------------------------------------------------------------------------------

TREE_SOURCE = "/usr/include"
TREE_MAX_FILE = 64 * 1024
TREE_FILES_PER_DIR = 100
TREE_VERSION = 1


def _tree_sources() -> list[str]:
    return [p for p in _walk_files([TREE_SOURCE]) if _classify(p) is not None]


def _tree_dir(index: int) -> str:
    d = index // TREE_FILES_PER_DIR
    return os.path.join(f"d{d // 100:02d}", f"d{(d // 10) % 10}", f"d{d % 10}")


def gen_tree(path: str, count: int, seed: int) -> tuple[int, int]:
    """Returns (files, bytes)."""
    rng = random.Random(f"{seed}/tree")
    sources = _tree_sources()
    tmp = path + ".tmp"
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    total = 0
    first_file = None
    try:
        for i in range(count):
            rel_dir = _tree_dir(i)
            os.makedirs(os.path.join(tmp, rel_dir), exist_ok=True)
            if sources:
                src = sources[i % len(sources)]
                name = f"{i:06d}-{os.path.basename(src)}"
                try:
                    with open(src, "rb") as f:
                        data = f.read(TREE_MAX_FILE)
                except OSError:
                    data = b""
            else:  # no /usr/include: synthetic C-like text
                name = f"{i:06d}-gen.h"
                lines = rng.randrange(0, 1200)
                data = "".join(
                    f"#define FERRY_GEN_{i}_{n} {rng.getrandbits(32)}\n" for n in range(lines)
                ).encode()[:TREE_MAX_FILE]
            if rng.random() < 0.02:
                data = b""  # a few empty files
            rel = os.path.join(rel_dir, name)
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(data)
            total += len(data)
            if first_file is None:
                first_file = rel
        # Symlinks: relative to a file and to a directory, absolute, dangling (both kinds).
        links = os.path.join(tmp, "links")
        os.makedirs(links)
        if first_file is not None:
            os.symlink(os.path.join("..", first_file), os.path.join(links, "relative-file"))
            os.symlink(os.path.join("..", os.path.dirname(first_file)), os.path.join(links, "relative-dir"))
        os.symlink("/usr/include/stdio.h", os.path.join(links, "absolute"))
        os.symlink("../no/such/file", os.path.join(links, "dangling-relative"))
        os.symlink("/nonexistent/ferry/dangling", os.path.join(links, "dangling-absolute"))
        # Empty directories.
        os.makedirs(os.path.join(tmp, "empty"))
        os.makedirs(os.path.join(tmp, "d00", "empty", "nested-empty"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)
    return count, total


# ----------------------------------------------------------------------------------------------
# plumbing
# ----------------------------------------------------------------------------------------------


class AtomicFile:
    """Writes to PATH.tmp with large buffers; renames to PATH on success, removes it on error."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
        self.f = None

    def __enter__(self):
        self.f = open(self.tmp, "wb", buffering=8 * MIB)
        return self.f

    def __exit__(self, exc_type, exc, tb):
        try:
            self.f.close()
        finally:
            if exc_type is None:
                os.replace(self.tmp, self.path)
            else:
                try:
                    os.unlink(self.tmp)
                except OSError:
                    pass
        return False


def _fmt_line(name: str, what: str, secs: float, note: str = "") -> str:
    return f"{name:<11} {what:>24}  {secs:7.1f} s{('  ' + note) if note else ''}"


def run(args) -> None:
    out = args.outdir
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise GenError(f"cannot create {out}: {e.strerror}") from e
    if not os.access(out, os.W_OK):
        raise GenError(f"{out} is not writable")
    size_mib = args.size_mib
    size = size_mib * MIB
    files = {"db": ("db.dat", gen_db), "mixed": ("mixed.bin", gen_mixed), "random": ("random.bin", gen_random)}
    for key in ALL_SETS:
        if key not in args.only:
            continue
        t0 = time.monotonic()
        if key in ("dbdir", "tree"):
            # Directories: regenerated only when their stamp (version, parameters) changed.
            if key == "dbdir":
                stamp = f"version={DBDIR_VERSION} size={size_mib} seed={args.seed}\n"
                what = f"{size_mib} MiB"
                gen = lambda p: gen_dbdir(p, size_mib, args.seed)  # noqa: E731
            else:
                stamp = f"version={TREE_VERSION} files={args.small_files} seed={args.seed}\n"
                what = f"{args.small_files} files"
                gen = lambda p: gen_tree(p, args.small_files, args.seed)  # noqa: E731
            path = os.path.join(out, key)
            stamp_path = os.path.join(out, f".{key}.stamp")
            try:
                with open(stamp_path) as f:
                    old = f.read()
            except OSError:
                old = ""
            if old == stamp and os.path.isdir(path):
                print(_fmt_line(f"{key}/", what, 0.0, "(exists, skipped)"), flush=True)
                continue
            if os.path.lexists(stamp_path):
                os.unlink(stamp_path)
            nfiles, nbytes = gen(path)
            with open(stamp_path, "w") as f:
                f.write(stamp)
            print(_fmt_line(f"{key}/", f"{nfiles} files, {nbytes / MIB:.1f} MiB", time.monotonic() - t0), flush=True)
            continue
        name, fn = files[key]
        path = os.path.join(out, name)
        try:
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size == size:
                print(_fmt_line(name, f"{size_mib} MiB", 0.0, "(exists, skipped)"), flush=True)
                continue
        except FileNotFoundError:
            pass
        fn(path, size_mib, args.seed)
        secs = time.monotonic() - t0
        rate = f"({size / MIB / secs:.0f} MiB/s)" if secs > 0 else ""
        print(_fmt_line(name, f"{size_mib} MiB", secs, rate), flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gen-data.py",
        description="Generate ferry sample data sets (db.dat, mixed.bin, random.bin, tree/) in OUTDIR.",
    )
    p.add_argument("outdir", metavar="OUTDIR")
    p.add_argument("--size-mib", type=int, default=1024, metavar="N",
                   help="size of db.dat, mixed.bin and random.bin in MiB (default 1024)")
    p.add_argument("--small-files", type=int, default=10000, metavar="N",
                   help="number of files in tree/ (default 10000)")
    p.add_argument("--only", default=",".join(DEFAULT_SETS), metavar="LIST",
                   help="comma-separated subset of: " + ",".join(ALL_SETS))
    p.add_argument("--seed", type=int, default=1, metavar="S", help="random seed (default 1)")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in ALL_SETS]
    if bad or not only:
        p.error(f"--only: unknown data set(s) {','.join(bad) or '(none given)'}; choose from {','.join(ALL_SETS)}")
    args.only = set(only)
    if args.size_mib < 0:
        p.error("--size-mib must be >= 0")
    if args.small_files < 0:
        p.error("--small-files must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except GenError as e:
        print(f"gen-data.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"gen-data.py: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gen-data.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
