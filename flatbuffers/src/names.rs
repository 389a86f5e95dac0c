//! The rule for queue names.

/// Longest queue name, in bytes.
pub const QUEUE_NAME_MAX: usize = 200;

/// A queue name is 1 to 200 characters of `[A-Za-z0-9._-]`, and not `.` or
/// `..` (it names a directory on every broker). Returns why a name is bad.
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("queue name is empty".into());
    }
    if name.len() > QUEUE_NAME_MAX {
        return Err(format!(
            "queue name is {} bytes, more than {QUEUE_NAME_MAX}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("queue name {name:?} is reserved"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "queue name {name:?} has {c:?}; only A-Z a-z 0-9 . _ - are allowed"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "orders", "orders.v2", "A_b-C.9", &"x".repeat(200), "..."] {
            assert!(validate_queue_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "é", "a\0", &"x".repeat(201)] {
            assert!(validate_queue_name(bad).is_err(), "{bad:?}");
        }
    }
}
