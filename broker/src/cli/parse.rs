//! Parsing human values on the command line: durations and byte sizes.

/// `7d`, `12h`, `30m`, `45s`, `500ms`, a plain number of milliseconds, or
/// `forever` / `-1` (no limit: `None`).
pub fn duration_ms(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "forever" || t == "-1" {
        return Ok(None);
    }
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad duration {text:?} (e.g. 7d, 12h, 30m, 45s, 500ms)"))?;
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 3600 * 1000,
        "d" => 24 * 3600 * 1000,
        _ => return Err(format!("bad duration unit in {text:?} (use ms, s, m, h or d)")),
    };
    n.checked_mul(factor)
        .filter(|v| *v > 0)
        .map(Some)
        .ok_or_else(|| format!("duration {text:?} must be positive and fit in 64 bits"))
}

/// `1048576`, `512KiB`, `64MiB`, `10GiB`, `2TiB` (also K/M/G/T), or
/// `unlimited` / `-1` (`None`).
pub fn bytes(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "unlimited" || t == "-1" {
        return Ok(None);
    }
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {text:?} (e.g. 512MiB, 10GiB)"))?;
    let shift = match unit {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return Err(format!("bad size unit in {text:?} (use KiB, MiB, GiB or TiB)")),
    };
    n.checked_mul(1u64 << shift)
        .filter(|v| *v > 0)
        .map(Some)
        .ok_or_else(|| format!("size {text:?} must be positive and fit in 64 bits"))
}

/// A duration as [`duration_ms`] reads it: the largest unit that divides
/// it exactly (`7d`, `90s`, `1500ms`).
pub fn show_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (24 * 3600 * 1000, "d"),
        (3600 * 1000, "h"),
        (60 * 1000, "m"),
        (1000, "s"),
    ];
    UNITS
        .iter()
        .find(|(factor, _)| ms > 0 && ms % factor == 0)
        .map_or_else(|| format!("{ms}ms"), |(factor, unit)| format!("{}{unit}", ms / factor))
}

/// A size as [`bytes`] reads it: the largest binary unit that divides it
/// exactly (`1MiB`, `10GiB`, `1000B`).
pub fn show_bytes(n: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    UNITS
        .iter()
        .find(|(shift, _)| n > 0 && n % (1u64 << shift) == 0)
        .map_or_else(|| format!("{n}B"), |(shift, unit)| format!("{}{unit}", n >> shift))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(duration_ms("7d"), Ok(Some(7 * 24 * 3600 * 1000)));
        assert_eq!(duration_ms("500ms"), Ok(Some(500)));
        assert_eq!(duration_ms("90"), Ok(Some(90)));
        assert_eq!(duration_ms("forever"), Ok(None));
        assert!(duration_ms("0s").is_err());
        assert!(duration_ms("3w").is_err());
        assert!(duration_ms("x").is_err());
        assert_eq!(bytes("64MiB"), Ok(Some(64 << 20)));
        assert_eq!(bytes("2G"), Ok(Some(2 << 30)));
        assert_eq!(bytes("-1"), Ok(None));
        assert!(bytes("99999999999999999999").is_err());
        assert!(bytes("5 parsecs").is_err());
    }

    #[test]
    fn shown_values_read_back() {
        assert_eq!(show_duration_ms(604_800_000), "7d");
        assert_eq!(show_duration_ms(90_000), "90s");
        assert_eq!(show_duration_ms(1500), "1500ms");
        assert_eq!(show_bytes(1 << 20), "1MiB");
        assert_eq!(show_bytes(10 << 30), "10GiB");
        assert_eq!(show_bytes(1000), "1000B");
        for ms in [1, 999, 1000, 61_000, 3_600_000, 86_400_000 * 30] {
            assert_eq!(duration_ms(&show_duration_ms(ms)), Ok(Some(ms)));
        }
        for n in [1, 1023, 1024, 1536, 1 << 20, 3 << 30, 1 << 40] {
            assert_eq!(bytes(&show_bytes(n)), Ok(Some(n)));
        }
    }
}
