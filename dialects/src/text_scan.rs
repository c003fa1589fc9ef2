//! Scanning streamed text that may stop mid-way: how much of its end to hold back because it
//! could still become a marker, and where a JSON value at its start ends. The reasoning
//! splitter and every call parser share these, so they hold back text the same way.

/// Length of the longest suffix of `text` that is a proper prefix of `marker`.
pub fn held_suffix(text: &str, marker: &str) -> usize {
    text.char_indices()
        .map(|(i, _)| &text[i..])
        .find(|s| marker.starts_with(s) && s.len() < marker.len())
        .map_or(0, str::len)
}

/// The length of the JSON object or array at the start of `s` (strings and escapes
/// respected), if it is complete there.
pub fn json_value_len(s: &str) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, b) in s.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}
