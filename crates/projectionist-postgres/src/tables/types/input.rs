//! What PostgreSQL's input of a `uuid` and of a `timestamptz` surely takes: checked byte by
//! byte, for each such value written over.

/// Whether PostgreSQL surely takes `s` as a `uuid`: the canonical form only, 32 hex digits in
/// groups of 8-4-4-4-12 (PostgreSQL refuses forms other parsers take, such as `urn:uuid:…`).
pub(super) fn surely_a_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter()
            .enumerate()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() })
}

/// Whether PostgreSQL surely takes `s` as a `timestamptz`: an RFC 3339 timestamp of years 1
/// to 9999 (PostgreSQL refuses year 0, which RFC 3339 parsers take), a real date, seconds
/// below 60, an offset within ±14:59. Checked byte by byte: it runs for every such value
/// written over (a projection's `updated_at`, in each event).
pub(super) fn surely_a_timestamptz(s: &str) -> bool {
    let b = s.as_bytes();
    let number = |from: usize, len: usize| -> Option<u32> {
        let digits = b.get(from..from + len)?;
        digits.iter().try_fold(0_u32, |n, d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let (Some(year), Some(month), Some(day)) = (number(0, 4), number(5, 2), number(8, 2)) else { return false };
    let (Some(hour), Some(minute), Some(second)) = (number(11, 2), number(14, 2), number(17, 2)) else { return false };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let shape = at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':');
    if !shape || year == 0 || !(1..=12).contains(&month) || !(1..=days).contains(&day) {
        return false;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return false;
    }
    // A fraction of up to nine digits, then the offset.
    let mut i = 19;
    if at(i, b'.') {
        let digits = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
        if !(1..=9).contains(&digits) {
            return false;
        }
        i += 1 + digits;
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            let (Some(h), Some(m)) = (number(i + 1, 2), number(i + 4, 2)) else { return false };
            at(i + 3, b':') && i + 6 == b.len() && h <= 14 && m <= 59
        }
        _ => false,
    }
}
