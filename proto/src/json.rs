//! How deep a JSON payload nests. shoal stores payloads as text and never
//! builds them into trees, but its readers do: Python's `json.loads` gives
//! up near 1,000 levels, serde_json at 128. A payload nested deeper than
//! [`MAX_JSON_DEPTH`] would be stored and then break every reader, so
//! writes are refused instead (by the coordinator and the shard node).

/// Arrays and objects inside each other, at most.
pub const MAX_JSON_DEPTH: usize = 64;

/// Why `text` cannot be stored as a JSON payload: it does not parse, or
/// it nests deeper than [`MAX_JSON_DEPTH`]. The one check the coordinator
/// and the shard node both run.
pub fn check_payload(text: &str) -> Result<(), String> {
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        return Err(format!("payload is not valid JSON: {e}"));
    }
    let depth = json_depth(text);
    if depth > MAX_JSON_DEPTH {
        return Err(format!("payload nests {depth} levels deep, more than the limit of {MAX_JSON_DEPTH}"));
    }
    Ok(())
}

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

    #[test]
    fn payloads_must_parse_and_stay_shallow() {
        assert!(check_payload(r#"{"a": [1]}"#).is_ok());
        assert!(check_payload("{oops").unwrap_err().contains("not valid JSON"));
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(check_payload(&deep).unwrap_err().contains("nests 65 levels"));
    }
}
