//! Which RDMA devices and ports the ib transport uses: `COLLC_IB_HCA` in NCCL_IB_HCA's grammar. A list of device
//! name prefixes separated by `,`, each with an optional `:port` (`mlx5_0:1,mlx5_1`); `^` first excludes them
//! instead (`^mlx5_3`); `=` after it (or first) makes them whole names (`=mlx5_1`, `^=mlx5_3:1`). Unset: every
//! active port of every device.

use std::fmt;
use std::str::FromStr;

/// A parsed `COLLC_IB_HCA`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaPattern {
    /// As written, for messages.
    text: String,
    exclude: bool,
    exact: bool,
    /// Device name (or prefix) and port (`None`: every port).
    entries: Vec<(String, Option<u8>)>,
}

impl HcaPattern {
    /// Whether port `port` of the device `device` is one to use.
    pub fn admits(&self, device: &str, port: u8) -> bool {
        let listed = self.entries.iter().any(|(name, only)| {
            let named = if self.exact { device == name } else { device.starts_with(name.as_str()) };
            named && only.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }
}

impl FromStr for HcaPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (exclude, exact, rest) = crate::transport::ifname::prefixes(text);
        let mut entries = Vec::new();
        for entry in rest.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry.starts_with(['^', '=']) {
                return Err(format!(
                    "`{text}`: `{entry}`: `^` and `=` go once, before the whole list (`^=mlx5_0,mlx5_1`)"
                ));
            }
            let (name, port) = match entry.split_once(':') {
                Some((name, port)) => match port.trim().parse::<u8>() {
                    Ok(port) if port >= 1 => (name.trim(), Some(port)),
                    _ => return Err(format!("`{text}`: `{entry}`: a port is a number from 1 to 255 (`mlx5_0:1`)")),
                },
                None => (entry, None),
            };
            if name.is_empty() {
                return Err(format!("`{text}`: `{entry}` names no device"));
            }
            entries.push((name.to_string(), port));
        }
        if entries.is_empty() {
            return Err(format!("`{text}` names no device (write `mlx5`, `mlx5_0:1,mlx5_1`, `^mlx5_3` or `=mlx5_0`)"));
        }
        Ok(HcaPattern { text: text.to_string(), exclude, exact, entries })
    }
}

/// An active port of an RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub device: String,
    pub port: u8,
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device, self.port)
    }
}

/// The ports of `all` (the active ones) to use: those `pattern` admits, or without one every one. An error says
/// what matched nothing and lists what there is.
pub fn select(pattern: Option<&HcaPattern>, all: &[Port]) -> Result<Vec<Port>, String> {
    let chosen: Vec<Port> =
        all.iter().filter(|p| pattern.is_none_or(|pattern| pattern.admits(&p.device, p.port))).cloned().collect();
    if chosen.is_empty() {
        let here = all.iter().map(Port::to_string).collect::<Vec<_>>().join(", ");
        let here = if here.is_empty() { "none".to_string() } else { here };
        return Err(match pattern {
            Some(pattern) => format!("COLLC_IB_HCA=`{}` matches no active port (active here: {here})", pattern.text),
            None => "no RDMA device has an active port".to_string(),
        });
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(list: &[(&str, u8)]) -> Vec<Port> {
        list.iter().map(|&(device, port)| Port { device: device.into(), port }).collect()
    }

    /// NCCL_IB_HCA's forms: prefixes, ports, exclusion, whole names; bad ports and misplaced `^`/`=` are errors
    /// that say how to write it.
    #[test]
    fn the_pattern_reads_as_nccl_ib_hca_does() {
        let all = ports(&[("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 1), ("mlx5_1", 2), ("bnxt_re0", 1)]);
        let chosen = |text: &str| -> Vec<String> {
            let pattern: HcaPattern = text.parse().unwrap();
            select(Some(&pattern), &all).unwrap().iter().map(Port::to_string).collect()
        };
        assert_eq!(chosen("mlx5"), ["mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "mlx5_1:2"]);
        assert_eq!(chosen("mlx5_1"), ["mlx5_1:1", "mlx5_10:1", "mlx5_1:2"]);
        assert_eq!(chosen("=mlx5_1"), ["mlx5_1:1", "mlx5_1:2"]);
        assert_eq!(chosen("=mlx5_1:2,bnxt_re0"), ["mlx5_1:2", "bnxt_re0:1"]);
        assert_eq!(chosen("^mlx5"), ["bnxt_re0:1"]);
        assert_eq!(chosen("^=mlx5_1:1"), ["mlx5_0:1", "mlx5_10:1", "mlx5_1:2", "bnxt_re0:1"]);
        assert_eq!(select(None, &all).unwrap().len(), 5);
        let none: HcaPattern = "=mlx5_2".parse().unwrap();
        let err = select(Some(&none), &all).unwrap_err();
        assert!(err.contains("COLLC_IB_HCA=`=mlx5_2` matches no active port") && err.contains("mlx5_0:1"), "{err}");
        assert!(select(None, &[]).unwrap_err().contains("no RDMA device"));
        for (bad, says) in [
            ("mlx5_0:x", "a port is a number"),
            ("mlx5_0:0", "a port is a number"),
            ("", "names no device"),
            ("mlx5_0,^mlx5_1", "go once"),
            (":1", "names no device"),
        ] {
            let err = bad.parse::<HcaPattern>().unwrap_err();
            assert!(err.contains(says), "`{bad}`: {err}");
        }
    }
}
