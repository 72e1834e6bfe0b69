# ferry: common tasks. Start with `make demo` or `make test` (see README.md).

CARGO ?= cargo
SHELL := /bin/bash

# Use rustup's cargo when it is installed but not on PATH yet.
ifeq ($(shell command -v $(CARGO) 2>/dev/null),)
  ifneq ($(wildcard $(HOME)/.cargo/bin/cargo),)
    export PATH := $(HOME)/.cargo/bin:$(PATH)
  endif
endif

.DEFAULT_GOAL := help
.PHONY: help demo prereqs test build install uninstall lint clean-mounts bench bench-quick bench-loopback bench-readers bench-trees bench-compression bench-s3 fuzz-build fuzz-smoke

help:
	@echo "make demo          build, export generated data with ferryd, mount it, copy and verify (FERRY_DEMO_MIB=512)"
	@echo "make test          install missing prerequisites (fuse3, rsync, lz4, Garage), build, run all tests"
	@echo "make build         release build of ferryd and ferry"
	@echo "make install       ferry, ferryd -> PREFIX/bin (/usr/local); mount.fuse.ferry -> SBINDIR (/sbin) for fstab and mount -t fuse.ferry"
	@echo "make lint          cargo fmt --check and clippy -D warnings"
	@echo "make clean-mounts  unmount leftover ferry mounts under /tmp and .demo"
	@echo "make bench         ferry vs nc, scp, rsync, sshfs, rclone on emulated links -> docs/BENCHMARKS.md"
	@echo "make bench-quick   a ~2-minute subset of it (bench/out/quick.md)"
	@echo "make bench-loopback  cp from a loopback mount: MB/s and peak memory"
	@echo "make bench-readers   reads through the mount alone vs during its background mirror (issue 13) -> bench/out/readers.md"
	@echo "make bench-trees     cp -r, rsync, tar, mirror, find, ls -lR of trees of real shapes (issue 14) -> bench/out/trees.md"
	@echo "make bench-compression  --compression auto vs lz4 vs nc|zstd -1 on real data, 4 links (issue 18) -> bench/out/compression.md"
	@echo "make bench-s3      ferry vs rclone on a 3-node Garage S3 cluster, 1gbit and wan (issue 19) -> bench/out/s3.md"
	@echo "make fuzz-build    build the cargo-fuzz targets (nightly; installs cargo-fuzz if missing)"
	@echo "make fuzz-smoke    run each fuzz target for FUZZ_SECONDS (60) and report executions"

demo:
	bash scripts/demo.sh

prereqs:
	bash scripts/prereqs.sh

# The end-to-end tests mount real FUSE file systems with the binaries in target/debug,
# so build them first; the S3 tests need Garage (built from crates.io once, then reused). FERRY_REQUIRE_FUSE=1 makes those tests fail instead of skip without FUSE.
test: prereqs
	bash scripts/prereqs-garage.sh
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

build:
	$(CARGO) build --release --bins

# mount(8) looks for helpers in /sbin only, so the helper goes there whatever PREFIX is.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= /sbin
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR)
	install -m 755 target/release/ferry target/release/ferryd $(DESTDIR)$(BINDIR)/
	sed 's|@FERRY@|$(BINDIR)/ferry|' scripts/mount.fuse.ferry > $(DESTDIR)$(SBINDIR)/mount.fuse.ferry
	chmod 755 $(DESTDIR)$(SBINDIR)/mount.fuse.ferry
	@echo "installed ferry and ferryd in $(DESTDIR)$(BINDIR), mount.fuse.ferry in $(DESTDIR)$(SBINDIR)"

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/ferry $(DESTDIR)$(BINDIR)/ferryd $(DESTDIR)$(SBINDIR)/mount.fuse.ferry

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Mounts of type fuse.ferry (or plain fuse with a source naming ferry) under /tmp or .demo,
# innermost first.
clean-mounts:
	@n=0; \
	while read -r src mnt type _; do \
		mnt=$$(printf '%b' "$$mnt"); \
		case "$$type" in \
			fuse.ferry) ;; \
			fuse|fuseblk) case "$$src" in *ferry*) ;; *) continue ;; esac ;; \
			*) continue ;; \
		esac; \
		case "$$mnt" in /tmp/*|$(CURDIR)/.demo|$(CURDIR)/.demo/*) ;; *) continue ;; esac; \
		echo "unmounting $$mnt"; n=$$((n + 1)); \
		fusermount3 -u "$$mnt" 2>/dev/null || fusermount3 -uz "$$mnt" 2>/dev/null || umount -l "$$mnt" || true; \
	done < <(tac /proc/mounts); \
	echo "clean-mounts: $$n mount(s) unmounted"

# Link benchmark (bench/run.sh): ferry beside nc, scp, rsync, sshfs and rclone on emulated
# links; writes docs/BENCHMARKS.md. bench-quick: a ~2-minute subset into bench/out/quick.md.
bench:
	bash bench/run.sh --copy-timeout 180

bench-quick:
	bash bench/run.sh --quick

# cp from a plain loopback mount: MB/s and peak memory of ferryd and ferry.
bench-loopback:
	bash bench/cp-loopback.sh --size-mib 1024 --runs 3 --kinds random,db,mixed

# Readers alone vs during the mount's background mirror (bench/readers.sh, issue 13): 4 KiB
# preads, fio, cp and pg_restore on the 1gbit, wan and loopback links; bench/out/readers.md.
bench-readers:
	bash bench/readers.sh --links 1gbit,wan,loopback

# Trees of real shapes (bench/trees.sh, issue 14): a source tree, a PostgreSQL data
# directory, a git working tree and 100,000 files in one directory, out of the mount and with
# ferry mirror, beside tar | lz4 | nc, on the 1gbit and wan links; bench/out/trees.md.
bench-trees:
	bash bench/trees.sh --links 1gbit,wan

# Compression (bench/compression.sh, issue 18): cp of 1 GiB of real binaries, a real
# PostgreSQL datafile and random data out of the mount with --compression auto and lz4,
# beside zstd -1 -T0 | nc, on 1gbit, 100mbit, wan and loopback; bench/out/compression.md.
bench-compression:
	bash bench/compression.sh --repeat 5

# S3 sources (bench/s3.sh, issue 19): ferry mount/mirror of a 3-node Garage cluster beside
# rclone mount/copy, on 1gbit and wan; bench/out/s3.md.
bench-s3:
	bash bench/s3.sh --links wan,1gbit --repeat 3

# Fuzzing (fuzz/, cargo-fuzz on the nightly toolchain): the frame and message decoders, and
# ferryd's whole connection handling on arbitrary client bytes.
FUZZ_SECONDS ?= 60
fuzz-build:
	bash scripts/fuzz.sh build

fuzz-smoke:
	bash scripts/fuzz.sh smoke $(FUZZ_SECONDS)
