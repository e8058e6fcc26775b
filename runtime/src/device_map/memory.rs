//! Memory sizes in accelerate's string forms (`"10GiB"`, `"500MB"`, `"1.5GB"`, plain bytes) and
//! `max_memory` maps (`0=2GiB,1=2GiB,cpu=8GiB`).

use std::collections::BTreeMap;

use super::{DeviceMapError, Placement};

/// Parses a size the way accelerate's `convert_file_size_to_int` does: decimal units (`KB`, `MB`,
/// `GB`, `TB`) are powers of 1000, binary units (`KiB`, `MiB`, `GiB`, `TiB`) powers of 1024, a
/// trailing `b` means bits, and a bare number is bytes.
pub fn parse_size(s: &str) -> Result<u64, DeviceMapError> {
    let bad = || DeviceMapError::BadSize {
        input: s.to_string(),
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim();
    let (scale, bits) = match unit {
        "" | "B" => (1.0, false),
        "KB" | "kB" => (1e3, false),
        "MB" => (1e6, false),
        "GB" => (1e9, false),
        "TB" => (1e12, false),
        "KiB" => (1024.0, false),
        "MiB" => (1024f64.powi(2), false),
        "GiB" => (1024f64.powi(3), false),
        "TiB" => (1024f64.powi(4), false),
        "Kb" | "kb" => (1e3, true),
        "Mb" => (1e6, true),
        "Gb" => (1e9, true),
        _ => return Err(bad()),
    };
    let bytes = value * scale / if bits { 8.0 } else { 1.0 };
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Parses `max_memory` given as `DEVICE=SIZE` pairs separated by commas, where DEVICE is an
/// accelerator index or `cpu`; a lone SIZE applies to every accelerator (`key` `*`).
pub fn parse_max_memory(s: &str) -> Result<MaxMemory, DeviceMapError> {
    let mut out = MaxMemory::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((dev, size)) => {
                let place = Placement::parse(dev.trim())?;
                out.per_device.insert(place, parse_size(size)?);
            }
            None => out.every_accelerator = Some(parse_size(part)?),
        }
    }
    Ok(out)
}

/// Memory limits per placement, as `max_memory` gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaxMemory {
    pub per_device: BTreeMap<Placement, u64>,
    /// A limit for every accelerator not named in `per_device`.
    pub every_accelerator: Option<u64>,
}

impl MaxMemory {
    /// The limit for `place`, if one was given.
    pub fn get(&self, place: &Placement) -> Option<u64> {
        self.per_device.get(place).copied().or(match place {
            Placement::Device(_) => self.every_accelerator,
            _ => None,
        })
    }
}

/// Bytes in binary units for tables.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_accelerate_forms() {
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("12345").unwrap(), 12345);
        assert_eq!(parse_size("8Gb").unwrap(), 1_000_000_000);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 << 20);
        for bad in ["", "GiB", "ten GB", "5XB", "-1GB", "1e400GB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn max_memory_pairs() {
        let m = parse_max_memory("0=2GiB, 1=3GiB,cpu=8GiB").unwrap();
        assert_eq!(m.get(&Placement::Device(0)), Some(2 << 30));
        assert_eq!(m.get(&Placement::Device(1)), Some(3 << 30));
        assert_eq!(m.get(&Placement::Cpu), Some(8 << 30));
        assert_eq!(m.get(&Placement::Device(2)), None);
        let all = parse_max_memory("16GiB").unwrap();
        assert_eq!(all.get(&Placement::Device(7)), Some(16 << 30));
        assert!(parse_max_memory("gpu0=1GB").is_err());
    }
}
