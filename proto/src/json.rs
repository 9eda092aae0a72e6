//! How deep a JSON payload nests. shoal stores payloads as text and never
//! builds them into trees, but its readers do: Python's `json.loads` gives
//! up near 1,000 levels, serde_json at 128. A payload nested deeper than
//! [`MAX_JSON_DEPTH`] would be stored and then break every reader, so
//! writes are refused instead (by the coordinator and the shard node).

/// Arrays and objects inside each other, at most.
pub const MAX_JSON_DEPTH: usize = 64;

/// The deepest nesting of arrays and objects in `text`, which must be
/// valid JSON (checked before); brackets inside strings do not count.
pub fn json_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                (false, _) => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#"{"a": [1, {"b": []}]}"#), 4);
        assert_eq!(json_depth(r#"["[[[[", "\"{{"]"#), 1);
        assert_eq!(json_depth(&format!("{}{}", "[".repeat(100), "]".repeat(100))), 100);
    }
}
