//! LEB128 variable-length integers, as used inside records.
//!
//! Unsigned values are plain LEB128 (7 bits a byte, low bits first, the high
//! bit set on every byte but the last). Signed values are zig-zag mapped first
//! (`0, -1, 1, -2 …` → `0, 1, 2, 3 …`) so small negative numbers stay short.
//! A u64 takes at most 10 bytes; a decoder that sees more rejects the input.

/// Most bytes a u64 can take.
pub const MAX_LEN: usize = 10;

/// Appends `value` to `out`.
pub fn put_u64(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends `value` zig-zag encoded.
pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    put_u64(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// Bytes `value` takes when encoded: one per started group of 7 bits
/// (branch-free; at least one byte, for 0).
#[inline]
pub fn len_u64(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Bytes `value` takes zig-zag encoded.
#[inline]
pub fn len_i64(value: i64) -> usize {
    len_u64(((value << 1) ^ (value >> 63)) as u64)
}

/// Decodes a u64 at the start of `buf`; returns it and the bytes used, or
/// `None` if `buf` ends first or the encoding is longer than [`MAX_LEN`].
///
/// Inlined with a fast path for one- and two-byte values (lengths, deltas
/// and counts inside records nearly always are): a consumer decodes about
/// seven of them per record.
#[inline]
pub fn get_u64(buf: &[u8]) -> Option<(u64, usize)> {
    match *buf {
        [b0, ..] if b0 < 0x80 => Some((u64::from(b0), 1)),
        [b0, b1, ..] if b1 < 0x80 => Some((u64::from(b0 & 0x7f) | (u64::from(b1) << 7), 2)),
        _ => get_u64_long(buf),
    }
}

/// [`get_u64`] for values of three bytes and more (or bad input).
#[cold]
fn get_u64_long(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for (i, &byte) in buf.iter().take(MAX_LEN).enumerate() {
        let bits = u64::from(byte & 0x7f);
        if i == MAX_LEN - 1 && byte > 1 {
            return None; // would overflow 64 bits
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Decodes a zig-zag i64 at the start of `buf`.
#[inline]
pub fn get_i64(buf: &[u8]) -> Option<(i64, usize)> {
    let (raw, used) = get_u64(buf)?;
    Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lengths_change_at_every_seventh_bit() {
        assert_eq!(len_u64(0), 1);
        for groups in 1..=9u32 {
            let top = (1u64 << (7 * groups)) - 1;
            assert_eq!((len_u64(top), len_u64(top + 1)), (groups as usize, groups as usize + 1));
        }
        assert_eq!(len_u64(u64::MAX), MAX_LEN);
        assert_eq!((len_i64(-64), len_i64(-65), len_i64(63), len_i64(64)), (1, 2, 1, 2));
    }

    proptest! {
        #[test]
        fn u64_round_trips(v in any::<u64>()) {
            let mut out = Vec::new();
            put_u64(&mut out, v);
            prop_assert_eq!(out.len(), len_u64(v));
            prop_assert_eq!(get_u64(&out), Some((v, out.len())));
        }

        #[test]
        fn i64_round_trips(v in any::<i64>()) {
            let mut out = Vec::new();
            put_i64(&mut out, v);
            prop_assert_eq!(out.len(), len_i64(v));
            prop_assert_eq!(get_i64(&out), Some((v, out.len())));
        }
    }

    /// The one- and two-byte fast paths agree with the general decoder on
    /// every value up to three bytes, and on truncated and padded input.
    #[test]
    fn short_values_decode_as_the_general_path_does() {
        let mut out = Vec::new();
        for v in 0..(1u64 << 15) {
            out.clear();
            put_u64(&mut out, v);
            out.push(0xaa); // what follows the value in a record
            assert_eq!(get_u64(&out), Some((v, len_u64(v))), "{v}");
            assert_eq!(get_u64(&out), get_u64_long(&out), "{v}");
        }
        for bytes in [&[][..], &[0x80], &[0xff], &[0x80, 0x80], &[0x80, 0x00], &[0xff, 0x7f]] {
            assert_eq!(get_u64(bytes), get_u64_long(bytes), "{bytes:?}");
        }
        assert_eq!(get_u64(&[0x80, 0x00]), Some((0, 2)), "a padded zero still decodes");
    }

    #[test]
    fn rejects_truncated_and_overlong() {
        assert_eq!(get_u64(&[0x80]), None);
        assert_eq!(get_u64(&[0xff; 11]), None);
        assert_eq!(
            get_u64(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            None
        );
        assert_eq!(
            get_u64(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Some((u64::MAX, 10))
        );
    }
}
