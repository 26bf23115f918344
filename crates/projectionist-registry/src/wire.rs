//! Confluent's wire format: a magic byte 0, the schema id as 4 bytes big-endian, then the
//! payload (for Protobuf, a list of message indexes first).

use crate::{Error, Result};

/// The length of the header: the magic byte and the schema id.
pub const HEADER_LEN: usize = 5;

/// The schema id of a value (or key) in Confluent's wire format, or `None` when it is not one.
///
/// A JSON document never starts with byte 0, so a first byte 0 and at least 5 bytes tell the
/// wire format apart from projectionist's other formats.
pub fn schema_id(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// The schema id and the payload after the header.
pub(crate) fn split(bytes: &[u8]) -> Result<(u32, &[u8])> {
    match schema_id(bytes) {
        Some(id) => Ok((id, &bytes[HEADER_LEN..])),
        None if bytes.first() == Some(&0) => {
            Err(Error::NotWireFormat(format!("{} bytes, shorter than the 5-byte header", bytes.len())))
        }
        None => Err(Error::NotWireFormat("the first byte is not the magic byte 0".into())),
    }
}

/// Protobuf's message indexes after the header: a zigzag varint count, then that many zigzag
/// varints; a count of 0 (one byte 0) means `[0]`, the first message. Returns the indexes
/// and the message's bytes.
pub(crate) fn message_indexes(payload: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    let mut rest = payload;
    let count = zigzag(&mut rest).ok_or("the message-index count is cut short or too long")?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    // Each index takes at least one byte: a count past what is left is not a list.
    let count = usize::try_from(count).ok().filter(|c| *c <= rest.len());
    let count = count
        .ok_or_else(|| format!("a message-index count of {} with {} bytes left", count_text(payload), rest.len()))?;
    let mut indexes = Vec::with_capacity(count);
    for _ in 0..count {
        let index = zigzag(&mut rest).ok_or("a message index is cut short or too long")?;
        indexes.push(usize::try_from(index).map_err(|_| format!("a negative message index ({index})"))?);
    }
    Ok((indexes, rest))
}

fn count_text(payload: &[u8]) -> String {
    let mut rest = payload;
    zigzag(&mut rest).map_or_else(|| "?".into(), |c| c.to_string())
}

/// A zigzag-encoded varint (Protobuf's `sint64`), advancing `bytes` past it.
fn zigzag(bytes: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_id_reads_the_header() {
        assert_eq!(schema_id(&[0, 0, 0, 1, 0x2a, 9]), Some(298));
        assert_eq!(schema_id(&[0, 0, 0, 0, 7]), Some(7));
        assert_eq!(schema_id(&[0, 0, 0, 7]), None);
        assert_eq!(schema_id(b"{\"a\":1}"), None);
        assert_eq!(schema_id(&[]), None);
    }

    #[test]
    fn split_says_why_not() {
        assert_eq!(split(&[0, 0, 0, 0, 3, 1, 2]).unwrap(), (3, &[1u8, 2][..]));
        assert!(split(&[0, 1]).unwrap_err().to_string().contains("2 bytes"));
        assert!(split(b"{}").unwrap_err().to_string().contains("magic byte"));
    }

    #[test]
    fn message_indexes_zigzag() {
        assert_eq!(message_indexes(&[0, 8]).unwrap(), (vec![0], &[8u8][..]));
        // count 2 (zigzag 4), indexes 1 (2) and 0 (0)
        assert_eq!(message_indexes(&[4, 2, 0, 8]).unwrap(), (vec![1, 0], &[8u8][..]));
        // count 1, index 300 (zigzag 600 = 0xd8 0x04)
        assert_eq!(message_indexes(&[2, 0xd8, 0x04]).unwrap().0, vec![300]);
        assert!(message_indexes(&[]).is_err());
        assert!(message_indexes(&[0x80]).is_err());
        assert!(message_indexes(&[2, 1]).unwrap_err().contains("negative"));
        assert!(message_indexes(&[40, 0]).unwrap_err().contains("count of 20"));
    }
}
