//! JSON answers compared as a client sees them: minus the members declared volatile, and
//! where they differ named by JSON pointer (RFC 6901).

use std::collections::BTreeSet;

/// `value` without the JSON pointers in `ignore`.
pub fn without(value: &serde_json::Value, ignore: &[String]) -> serde_json::Value {
    let mut v = value.clone();
    for p in ignore {
        let (parent, last) = match p.rfind('/') {
            Some(i) => (&p[..i], &p[i + 1..]),
            None => continue,
        };
        let last = last.replace("~1", "/").replace("~0", "~");
        match v.pointer_mut(parent) {
            Some(serde_json::Value::Object(o)) => {
                o.remove(&last);
            }
            Some(serde_json::Value::Array(a)) => {
                if let Ok(i) = last.parse::<usize>() {
                    if i < a.len() {
                        a[i] = serde_json::Value::Null;
                    }
                }
            }
            _ => {}
        }
    }
    v
}

/// The JSON pointers (RFC 6901) at which `a` and `b` differ, leaves first found, at most
/// `limit` of them: what a failed `same answer` offers as candidates for `ignore`.
pub fn differing_pointers(
    a: &serde_json::Value,
    b: &serde_json::Value,
    limit: usize,
) -> Vec<String> {
    use serde_json::Value;
    fn walk(
        a: Option<&Value>,
        b: Option<&Value>,
        at: &mut String,
        out: &mut Vec<String>,
        limit: usize,
    ) {
        if out.len() >= limit || a == b {
            return;
        }
        let len = at.len();
        match (a, b) {
            (Some(Value::Object(x)), Some(Value::Object(y))) => {
                let names: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for n in names {
                    at.push('/');
                    at.push_str(&n.replace('~', "~0").replace('/', "~1"));
                    walk(x.get(n), y.get(n), at, out, limit);
                    at.truncate(len);
                }
            }
            (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    at.push_str(&format!("/{i}"));
                    walk(Some(p), Some(q), at, out, limit);
                    at.truncate(len);
                }
            }
            _ => out.push(if at.is_empty() {
                "/".to_string()
            } else {
                at.clone()
            }),
        }
    }
    let mut out = Vec::new();
    walk(Some(a), Some(b), &mut String::new(), &mut out, limit);
    out
}

#[cfg(test)]
mod tests {
    use super::differing_pointers;
    use serde_json::json;

    #[test]
    fn differing_pointers_name_the_leaves_that_differ_and_stop_at_the_limit() {
        let a = json!({"id": 1, "meta": {"at": "t1", "a/b": 1}, "tags": ["x", "y"]});
        let b = json!({"id": 1, "meta": {"at": "t2", "a/b": 2}, "tags": ["x", "z"], "new": true});
        assert_eq!(
            differing_pointers(&a, &b, 8),
            ["/meta/a~1b", "/meta/at", "/new", "/tags/1"]
        );
        assert_eq!(differing_pointers(&a, &b, 2).len(), 2);
        assert!(differing_pointers(&a, &a, 8).is_empty());
        assert_eq!(differing_pointers(&json!(1), &json!(2), 8), ["/"]);
    }
}
