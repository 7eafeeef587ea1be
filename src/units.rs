//! Byte sizes as operators write them: `4G`, `256M`, `2MiB`, `64k`, `4096`.
//!
//! Suffixes are binary (K = KiB = 1024); a trailing `B` and an `i` are accepted and mean the
//! same. Parsing is exact: anything that does not name a whole number of bytes is an error.

use std::fmt;
use std::str::FromStr;

/// A number of bytes, parsed from and printed as a human size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeParseError(pub String);

impl fmt::Display for SizeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeParseError {}

impl FromStr for ByteSize {
    type Err = SizeParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let digits_end = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        let (digits, suffix) = trimmed.split_at(digits_end);
        if digits.is_empty() {
            return Err(SizeParseError(format!(
                "'{text}' is not a size: expected a whole number with an optional unit (4G, 256M, 2MiB, 4096)"
            )));
        }
        let number: u64 = digits
            .parse()
            .map_err(|_| SizeParseError(format!("'{text}' is too large a number")))?;
        let unit = suffix.trim().to_ascii_lowercase();
        let shift = match unit.as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => {
                return Err(SizeParseError(format!(
                    "'{text}' has an unknown unit '{suffix}': use K, M, G or T (binary), with optional iB/B"
                )))
            }
        };
        number
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| SizeParseError(format!("'{text}' does not fit in 64 bits")))
    }
}

impl fmt::Display for ByteSize {
    /// Prints the largest binary unit that divides the size exactly, so the text parses back to
    /// the same number (`2 MiB`, `1536 KiB`, `100 B`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        let bytes = self.0;
        if bytes != 0 {
            for (shift, name) in UNITS {
                let unit = 1u64 << shift;
                if bytes % unit == 0 {
                    return write!(f, "{} {name}", bytes / unit);
                }
            }
        }
        write!(f, "{bytes} B")
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    /// Accepts either an integer (bytes) or a string with a unit.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bytes(bytes) => Ok(ByteSize(bytes)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_operators_write() {
        let cases = [
            ("4096", 4096),
            ("4G", 4 << 30),
            ("256M", 256 << 20),
            ("2MiB", 2 << 20),
            ("2 MiB", 2 << 20),
            ("64k", 64 << 10),
            ("1KB", 1024),
            ("7b", 7),
            ("1T", 1 << 40),
        ];
        for (text, bytes) in cases {
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{text}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_whole_size() {
        for text in [
            "",
            "M",
            "1.5G",
            "-1",
            "4X",
            "99999999999999999999",
            "20000000T",
        ] {
            assert!(text.parse::<ByteSize>().is_err(), "{text} should not parse");
        }
    }

    #[test]
    fn display_round_trips() {
        for bytes in [0, 1, 100, 1024, 1536 << 10, 2 << 20, 3 << 30, 5 << 40] {
            let text = ByteSize(bytes).to_string();
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{text}");
        }
    }
}
