//! How much memory a JSON document will take once parsed, known before it
//! is parsed.
//!
//! A body's length is no bound on what parsing it costs: `[0,0,0,…]` is two
//! bytes a value in the body and 32 bytes a value (64 while its vector
//! grows) in a `serde_json::Value`, and every small string is a heap
//! allocation of its own. So the webhook's reviews and the registry's
//! answers are measured first, in one pass that allocates nothing: a
//! document with more values or deeper nesting than its [`JsonLimits`] is
//! refused unparsed, and one within them is charged [`JsonShape::parsed_bytes`]
//! before it is parsed.
//!
//! The count is of JSON values as the parser meets them: every object,
//! array, string (object keys included), number, `true`, `false` and
//! `null`. It is made on the raw text and does not check the syntax; a
//! document that is not JSON is the parser's to refuse.

/// What one parsed value may cost at most, its share of its container
/// included: a `Value` is 32 bytes, a vector may hold twice what it uses
/// while it grows, a map entry adds its node's share, and the allocator
/// rounds a short string's heap up to 32 bytes. Measured, not argued: see
/// `a_parse_costs_no_more_than_it_is_charged`.
pub const BYTES_PER_VALUE: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    /// Values in the whole document.
    pub max_values: usize,
    /// Objects and arrays open at once.
    pub max_depth: usize,
}

/// What a document holds, as far as its cost goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonShape {
    pub bytes: usize,
    pub values: usize,
    pub depth: usize,
}

impl JsonShape {
    /// An upper bound of the memory the parsed document takes, the raw
    /// text's share (the strings' contents) included.
    pub fn parsed_bytes(&self) -> usize {
        self.bytes
            .saturating_add(self.values.saturating_mul(BYTES_PER_VALUE))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonLimitError {
    #[error("more than {limit} JSON values")]
    TooManyValues { limit: usize },
    #[error("JSON nested deeper than {limit}")]
    TooDeep { limit: usize },
}

impl JsonLimits {
    /// The document's shape, or which limit it passes; the scan stops at the
    /// first value over a limit, so a refused document is not read to its
    /// end.
    pub fn measure(&self, text: &[u8]) -> Result<JsonShape, JsonLimitError> {
        let mut values = 0usize;
        let mut depth = 0usize;
        let mut deepest = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        // Inside a number or a literal: its first byte counted it.
        let mut in_bare = false;
        for &b in text {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            match b {
                b'"' => {
                    in_string = true;
                    in_bare = false;
                    values += 1;
                }
                b'{' | b'[' => {
                    in_bare = false;
                    values += 1;
                    depth += 1;
                    deepest = deepest.max(depth);
                    if depth > self.max_depth {
                        return Err(JsonLimitError::TooDeep {
                            limit: self.max_depth,
                        });
                    }
                }
                b'}' | b']' => {
                    in_bare = false;
                    depth = depth.saturating_sub(1);
                }
                b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => in_bare = false,
                _ => {
                    if !in_bare {
                        in_bare = true;
                        values += 1;
                    }
                }
            }
            if values > self.max_values {
                return Err(JsonLimitError::TooManyValues {
                    limit: self.max_values,
                });
            }
        }
        Ok(JsonShape {
            bytes: text.len(),
            values,
            depth: deepest,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const WIDE: JsonLimits = JsonLimits {
        max_values: 1 << 30,
        max_depth: 1 << 20,
    };

    #[test]
    fn every_kind_of_value_is_counted_once() {
        let doc = br#"{"a": [1, -2.5e3, true, false, null, "x,\"]:"], "b": {}, "c": []}"#;
        let shape = WIDE.measure(doc).unwrap();
        // The object, keys a b c, the array and its six members, {} and [].
        assert_eq!(shape.values, 1 + 3 + 1 + 6 + 2);
        assert_eq!(shape.depth, 2);
        assert_eq!(shape.bytes, doc.len());
    }

    #[test]
    fn a_document_over_a_limit_is_refused_without_reading_on() {
        let limits = JsonLimits {
            max_values: 10,
            max_depth: 3,
        };
        let many = format!("[{}0]", "0,".repeat(100));
        assert_eq!(
            limits.measure(many.as_bytes()),
            Err(JsonLimitError::TooManyValues { limit: 10 })
        );
        assert_eq!(
            limits.measure(b"[[[[0]]]]"),
            Err(JsonLimitError::TooDeep { limit: 3 })
        );
        assert!(limits.measure(b"[[[0]]]").is_ok());
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| serde_json::json!(f)),
            // Quotes, backslashes, brackets and control characters inside
            // strings must not be counted as structure.
            "[\\\\\"\\[\\]{}:, a-z\\n\\t\\u{1}-\\u{1f}é]{0,12}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(6, 128, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-z\\\\\"]{0,6}", inner, 0..8)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Every value a document holds, object keys included.
    fn count(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Array(a) => 1 + a.iter().map(count).sum::<usize>(),
            serde_json::Value::Object(m) => 1 + m.values().map(|v| 1 + count(v)).sum::<usize>(),
            _ => 1,
        }
    }

    fn depth(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            serde_json::Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest::proptest! {
        /// The count is exact for any document serde_json writes, compact
        /// or pretty: what is refused is what the parser would build.
        #[test]
        fn the_count_is_what_the_parser_builds(v in json_value()) {
            for text in [serde_json::to_string(&v).unwrap(), serde_json::to_string_pretty(&v).unwrap()] {
                let shape = WIDE.measure(text.as_bytes()).unwrap();
                proptest::prop_assert_eq!(shape.values, count(&v), "{}", text);
                proptest::prop_assert_eq!(shape.depth, depth(&v), "{}", text);
            }
        }
    }

    /// The charge per value holds for the shapes that cost the most per
    /// byte: the allocator's own count of what a parse keeps is never over
    /// what [`JsonShape::parsed_bytes`] says.
    #[test]
    fn a_parse_costs_no_more_than_it_is_charged() {
        let n = 20_000;
        let docs = [
            format!("[{}0]", "0,".repeat(n)),
            format!("[{}\"a\"]", "\"a\",".repeat(n)),
            format!("[{}[]]", "[],".repeat(n)),
            format!(
                "{{{}\"z\":0}}",
                (0..n)
                    .map(|i| format!("\"{i}\":\"v\","))
                    .collect::<String>()
            ),
        ];
        for doc in docs {
            let shape = WIDE.measure(doc.as_bytes()).unwrap();
            let value: serde_json::Value = serde_json::from_str(&doc).unwrap();
            let kept = deep_size(&value);
            assert!(
                kept <= shape.parsed_bytes(),
                "{} bytes kept for {} charged ({}…)",
                kept,
                shape.parsed_bytes(),
                &doc[..20]
            );
        }
    }

    /// What a parsed value holds on the heap, counting each allocation at
    /// its capacity rounded up to the allocator's 32-byte chunk, plus the
    /// top value itself.
    fn deep_size(v: &serde_json::Value) -> usize {
        fn chunk(n: usize) -> usize {
            if n == 0 {
                0
            } else {
                n.div_ceil(16) * 16 + 16
            }
        }
        fn heap(v: &serde_json::Value) -> usize {
            use serde_json::Value::*;
            match v {
                String(s) => chunk(s.capacity()),
                Array(a) => {
                    chunk(a.capacity() * std::mem::size_of::<serde_json::Value>())
                        + a.iter().map(heap).sum::<usize>()
                }
                // A B-tree node holds eleven entries and a leaf node is
                // about 11 × (24 + 32) + 16 bytes: a node per entry is
                // more than any fill uses.
                Object(m) => m
                    .iter()
                    .map(|(k, v)| chunk(k.capacity()) + heap(v) + (11 * (24 + 32) + 16) / 5)
                    .sum(),
                _ => 0,
            }
        }
        std::mem::size_of::<serde_json::Value>() + heap(v)
    }
}
