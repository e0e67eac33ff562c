//! Resource quantities (`500m`, `2`, `1Gi`, `512M`) as the scheduler and kubelet count them:
//! cpu in millicores, everything else in whole units (bytes, pods).

/// Parses a quantity into thousandths of its unit (so `500m` cpu is 500 and `1Gi` is
/// 1073741824000). `None` when it is not a quantity.
pub fn parse_milli(text: &str) -> Option<i128> {
    let text = text.trim();
    // The sign applies to the whole number, fraction included (`-1.5` is -1500).
    if let Some(magnitude) = text.strip_prefix('-') {
        return parse_milli(
            magnitude
                .strip_prefix(['+', '-'])
                .map_or(magnitude, |_| "x"),
        )
        .map(|v| -v);
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (multiplier_num, multiplier_den): (i128, i128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "k" => (1000 * 1000, 1),
        "M" => (1000 * 1_000_000, 1),
        "G" => (1000 * 1_000_000_000, 1),
        "T" => (1000 * 1_000_000_000_000, 1),
        "P" => (1000 * 1_000_000_000_000_000, 1),
        "Ki" => (1000 * 1024, 1),
        "Mi" => (1000 * 1024 * 1024, 1),
        "Gi" => (1000 * 1024 * 1024 * 1024, 1),
        "Ti" => (1000 * 1024 * 1024 * 1024 * 1024, 1),
        "Pi" => (1000 * 1024 * 1024 * 1024 * 1024 * 1024, 1),
        s if s.starts_with(['e', 'E']) => {
            let exponent: u32 = s[1..].parse().ok()?;
            (1000 * 10i128.checked_pow(exponent)?, 1)
        }
        _ => return None,
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    let whole: i128 = if whole.is_empty() || whole == "+" {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(multiplier_num)?;
    if !fraction.is_empty() {
        let digits = fraction.len() as u32;
        let fraction: i128 = fraction.parse().ok()?;
        value += fraction.checked_mul(multiplier_num)? / 10i128.checked_pow(digits)?;
    }
    Some(value / multiplier_den)
}

/// A cpu quantity in millicores.
pub fn cpu_millis(text: &str) -> Option<i64> {
    parse_milli(text).map(|v| v as i64)
}

/// A memory (or count) quantity in whole units, rounded up.
pub fn units(text: &str) -> Option<i64> {
    parse_milli(text).map(|v| ((v + 999) / 1000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory() {
        let cpu = [
            ("500m", 500),
            ("2", 2000),
            ("0.5", 500),
            ("1.25", 1250),
            ("100m", 100),
        ];
        for (text, want) in cpu {
            assert_eq!(cpu_millis(text), Some(want), "{text}");
        }
        let memory = [
            ("1Gi", 1 << 30),
            ("512Mi", 512 << 20),
            ("1G", 1_000_000_000),
            ("128974848", 128974848),
            ("129e6", 129_000_000),
            ("1.5Gi", 3 << 29),
        ];
        for (text, want) in memory {
            assert_eq!(units(text), Some(want), "{text}");
        }
        assert_eq!(units("lots"), None);
        assert_eq!(parse_milli("-1.5"), Some(-1500));
        assert_eq!(parse_milli("-0.5"), Some(-500));
        assert_eq!(parse_milli("-1Gi"), Some(-(1000i128 << 30)));
        assert_eq!(parse_milli("+2"), Some(2000));
        assert_eq!(parse_milli("--2"), None);
    }
}
