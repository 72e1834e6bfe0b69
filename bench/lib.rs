//! Data for ferry's criterion benchmarks (`cargo bench -p ferry-bench`): in-memory
//! stand-ins for the link harness's data sets, so codec and compression regressions show
//! without a network. The link benchmarks themselves are `bench/run.sh` and
//! `bench/cp-loopback.sh`.

use bytes::Bytes;

/// One chunk shaped like PostgreSQL heap pages of pgbench_accounts rows: page headers,
/// line pointers, tuples whose ids count up and whose filler is spaces (lz4 ratio ~10).
pub fn db_chunk(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    let mut aid: u32 = 1;
    while out.len() < len {
        let mut page = vec![0u8; 8192];
        page[0..8].copy_from_slice(&u64::from(aid).to_le_bytes());
        let mut off = 24;
        let mut upper = 8192;
        while upper >= off + 4 + 121 {
            upper -= 121;
            page[off..off + 4].copy_from_slice(&((upper as u32) | (121 << 17)).to_le_bytes());
            off += 4;
            let t = &mut page[upper..upper + 121];
            t[0..4].copy_from_slice(&(aid.wrapping_mul(7)).to_le_bytes());
            t[23..27].copy_from_slice(&aid.to_le_bytes());
            t[27..31].copy_from_slice(&(aid / 100_000 + 1).to_le_bytes());
            t[35..].fill(b' ');
            aid += 1;
        }
        out.extend_from_slice(&page);
    }
    out.truncate(len);
    Bytes::from(out)
}

/// One chunk of incompressible bytes (xorshift).
pub fn random_chunk(len: usize) -> Bytes {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// Half text-like, half random: roughly the lz4 ratio 2 of the mixed data set.
pub fn mixed_chunk(len: usize) -> Bytes {
    let text =
        b"static inline int ferry_read(struct chunk *c, size_t off) { return c->len - off; }\n";
    let mut out: Vec<u8> = text.iter().cycle().take(len / 2).copied().collect();
    out.extend_from_slice(&random_chunk(len - len / 2));
    Bytes::from(out)
}
