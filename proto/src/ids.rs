//! Ids that cross the wire, validated once where a request enters.

use std::fmt;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {why}")]
pub struct IdError {
    pub what: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// A collection's name: 1 to 64 characters of `[A-Za-z0-9_-]`, starting
/// with a letter or digit, so it is safe as a directory name and a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollectionName(String);

impl CollectionName {
    pub const MAX_LEN: usize = 64;

    pub fn parse(s: &str) -> Result<Self, IdError> {
        let err = |why| Err(IdError { what: "collection name", value: s.chars().take(80).collect(), why });
        if s.is_empty() {
            return err("it is empty");
        }
        if s.len() > Self::MAX_LEN {
            return err("it is longer than 64 characters");
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return err("only letters, digits, '_' and '-' are allowed");
        }
        if !s.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return err("it must start with a letter or a digit");
        }
        Ok(CollectionName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CollectionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A shard node's id in the cluster (its name in the membership).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if s.is_empty() || s.len() > 128 || !s.chars().all(|c| c.is_ascii_graphic()) {
            return Err(IdError { what: "node id", value: s.chars().take(80).collect(), why: "must be 1 to 128 visible ASCII characters" });
        }
        Ok(NodeId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_names_are_checked() {
        assert!(CollectionName::parse("pypi-2026_v1").is_ok());
        for bad in ["", "-x", "a/b", "a b", "ä", &"x".repeat(65), ".."] {
            assert!(CollectionName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(NodeId::parse("node-1").is_ok());
        assert!(NodeId::parse("").is_err());
    }
}
