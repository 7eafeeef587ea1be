//! Numbers as memcached's `safe_strto*` read them (`util.c`, on a 64-bit Linux): the text and
//! meta protocols' tokens, and the counters INCR/DECR find in stored values.

fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strtoull` in base 10 over a token (its end is the C string's NUL): the magnitude,
/// whether a `-` preceded it, and where parsing stopped; `None` when no digit was read or the
/// magnitude overflows (ERANGE).
fn c_strtou(text: &[u8]) -> Option<(u64, bool, usize)> {
    let mut i = text.iter().take_while(|&&b| c_isspace(b)).count();
    let negative = text.get(i) == Some(&b'-');
    if matches!(text.get(i), Some(b'+' | b'-')) {
        i += 1;
    }
    let start = i;
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(d) = text.get(i).filter(|b| b.is_ascii_digit()) {
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start || overflow {
        return None;
    }
    Some((value, negative, i))
}

/// The number ends the token or is followed by a blank (memcached's check on `endptr`).
fn ends_cleanly(text: &[u8], end: usize) -> bool {
    end == text.len() || c_isspace(text[end])
}

/// memcached's `safe_strtoull` (also how the store reads a counter for INCR/DECR), except that
/// a negative number is refused however large (memcached accepted one whose magnitude is past
/// 2^63, wrapped: `-18446744073709551615` was 1).
pub fn safe_strtoull(text: &[u8]) -> Option<u64> {
    let (magnitude, negative, end) = c_strtou(text)?;
    if !ends_cleanly(text, end) || (negative && magnitude != 0) {
        return None;
    }
    Some(magnitude)
}

/// memcached's `safe_strtoul` into a `uint32_t`, refusing what does not fit (never truncated).
pub fn safe_strtoul(text: &[u8]) -> Option<u32> {
    safe_strtoull(text).and_then(|v| u32::try_from(v).ok())
}

/// Plain decimal digits and nothing else (no sign, no blanks), at most `u32::MAX`: memcached
/// 1.6.45's `mcmc_tokto32` for a data length, and Headroom's placement extension's numbers.
pub fn digits_u32(text: &[u8]) -> Option<u32> {
    if text.is_empty() || text.len() > 10 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    text.iter()
        .try_fold(0u64, |n, &d| Some(n * 10 + u64::from(d - b'0')))
        .and_then(|n| u32::try_from(n).ok())
}

/// An optional `-`, then digits only, into an `int32_t` (memcached 1.6.45's `mcmc_tokto32` for
/// a signed number: a meta TTL flag).
pub fn digits_i32(text: &[u8]) -> Option<i32> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || text.len() > 11 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// memcached's `safe_strtol` into an `int32_t`, refusing what does not fit (never truncated).
pub fn safe_strtol(text: &[u8]) -> Option<i32> {
    let (magnitude, negative, end) = c_strtou(text)?;
    let value = if negative {
        0i64.checked_sub_unsigned(magnitude)?
    } else {
        i64::try_from(magnitude).ok()?
    };
    if !ends_cleanly(text, end) {
        return None;
    }
    i32::try_from(value).ok()
}
