//! GPT-2's reversible byte → printable-character map (`bytes_to_unicode` in OpenAI's
//! `encoder.py`). BPE runs on these characters so that vocabulary entries never contain raw
//! whitespace or control bytes.

/// `byte → char` for all 256 bytes: printable Latin-1 bytes map to themselves, the other 68
/// bytes to `U+0100 + n` in byte order.
pub fn byte_to_char_table() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let code = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        // Every code here is < 0x200, far from the surrogate range, so the conversion holds.
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`], dense for fast decoding: index by `char as usize`
/// (the image lies below U+0200); `None` for characters outside the map.
pub fn char_to_byte_table(table: &[char; 256]) -> Vec<Option<u8>> {
    let mut inv = vec![None; 0x200];
    for (b, &c) in table.iter().enumerate() {
        inv[c as usize] = Some(b as u8);
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection_with_gpt2_landmarks() {
        let t = byte_to_char_table();
        // Landmarks of GPT-2's vocabulary: space → 'Ġ', newline → 'Ċ', '!' stays '!'.
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[0], 'Ā');
        let inv = char_to_byte_table(&t);
        for b in 0..=255u8 {
            assert_eq!(inv[t[b as usize] as usize], Some(b));
        }
        let mut sorted: Vec<char> = t.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        assert_eq!(inv['Ő' as usize], None);
    }
}
