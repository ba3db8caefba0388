//! Which network interfaces a socket transport uses: `COLLC_SOCKET_IFNAME` in NCCL_SOCKET_IFNAME's grammar. A list
//! of name prefixes separated by `,` (`eth,ib`); `^` first excludes them instead (`^docker,lo`); `=` after it (or
//! first) makes them whole names (`=eth0`, `^=docker0`). Unset, NCCL's default: every interface but `docker*` and
//! `lo*`, else the loopback.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A parsed `COLLC_SOCKET_IFNAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfPattern {
    /// As written, for messages.
    text: String,
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfPattern {
    /// Whether the interface `name` is one to use.
    pub fn admits(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        listed != self.exclude
    }
}

impl FromStr for IfPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (exclude, exact, rest) = prefixes(text);
        let names: Vec<String> = rest.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        if names.is_empty() {
            return Err(format!("`{text}` names no interface (write `eth`, `^docker`, `=eth0` or `^=docker0`)"));
        }
        if let Some(bad) = names.iter().find(|n| n.starts_with(['^', '='])) {
            return Err(format!("`{text}`: `{bad}`: `^` and `=` go once, before the whole list (`^=eth0,eth1`)"));
        }
        Ok(IfPattern { text: text.to_string(), exclude, exact, names })
    }
}

/// NCCL's list prefixes (NCCL_SOCKET_IFNAME's, NCCL_IB_HCA's): `^` first excludes what the list names, `=` after
/// it (or first) makes the names whole; returns (exclude, exact, the list).
pub(crate) fn prefixes(text: &str) -> (bool, bool, &str) {
    let (exclude, rest) = match text.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, text.trim()),
    };
    match rest.strip_prefix('=') {
        Some(rest) => (exclude, true, rest),
        None => (exclude, false, rest),
    }
}

/// One address of an interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.addr)
    }
}

/// This host's interfaces that are up, with their IPv4 and IPv6 addresses, in the order the kernel lists them.
pub fn interfaces() -> std::io::Result<Vec<Interface>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs made, alive until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: a non-null address of the family it says; the name is a C string.
        let (family, name) = unsafe { ((*ifa.ifa_addr).sa_family as i32, std::ffi::CStr::from_ptr(ifa.ifa_name)) };
        let addr = match family {
            // SAFETY: an AF_INET address is a sockaddr_in.
            libc::AF_INET => {
                IpAddr::from(unsafe { (*(ifa.ifa_addr as *const libc::sockaddr_in)).sin_addr.s_addr.to_ne_bytes() })
            }
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            libc::AF_INET6 => IpAddr::from(unsafe { (*(ifa.ifa_addr as *const libc::sockaddr_in6)).sin6_addr.s6_addr }),
            _ => continue,
        };
        found.push(Interface { name: name.to_string_lossy().into_owned(), addr });
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// The interfaces of `all` to use: those `pattern` admits, or without one NCCL's default. An error says what
/// matched nothing and lists what there is.
pub fn select(pattern: Option<&IfPattern>, all: &[Interface]) -> Result<Vec<Interface>, String> {
    let chosen: Vec<Interface> = match pattern {
        Some(pattern) => all.iter().filter(|i| pattern.admits(&i.name)).cloned().collect(),
        None => {
            let usual: IfPattern = "^docker,lo".parse().expect("a pattern");
            let chosen: Vec<Interface> = all.iter().filter(|i| usual.admits(&i.name)).cloned().collect();
            match chosen.is_empty() {
                true => all.iter().filter(|i| i.name.starts_with("lo")).cloned().collect(),
                false => chosen,
            }
        }
    };
    if chosen.is_empty() {
        let here = all.iter().map(Interface::to_string).collect::<Vec<_>>().join(", ");
        let what = pattern
            .map_or("no interface but docker and loopback ones, and no loopback,".to_string(), |pattern| {
                format!("COLLC_SOCKET_IFNAME=`{}` matches no interface that is up", pattern.text)
            });
        return Err(format!("{what} on this host (up here: {})", if here.is_empty() { "none" } else { &here }));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<Interface> {
        let at = |name: &str, addr: &str| Interface { name: name.into(), addr: addr.parse().expect("an address") };
        vec![at("lo", "127.0.0.1"), at("eth0", "192.0.2.2"), at("eth10", "192.0.3.2"), at("docker0", "172.17.0.1")]
    }

    fn names(pattern: &str) -> Result<Vec<String>, String> {
        let parsed: IfPattern = pattern.parse()?;
        Ok(select(Some(&parsed), &host())?.into_iter().map(|i| i.name).collect())
    }

    #[test]
    fn prefixes_exclusions_and_exact_names_follow_nccl() {
        assert_eq!(names("eth").unwrap(), ["eth0", "eth10"]);
        assert!(names("=eth1").unwrap_err().contains("matches no interface"));
        assert_eq!(names("=eth0").unwrap(), ["eth0"]);
        assert_eq!(names("=eth0,docker0").unwrap(), ["eth0", "docker0"]);
        assert_eq!(names("^docker,lo").unwrap(), ["eth0", "eth10"]);
        assert_eq!(names("^=eth0").unwrap(), ["lo", "eth10", "docker0"]);
        let none = names("ib").unwrap_err();
        assert!(none.contains("`ib`") && none.contains("eth0 192.0.2.2"), "{none}");
    }

    #[test]
    fn bad_patterns_are_named() {
        for bad in ["", "^", "^=", ",", "eth,^lo"] {
            assert!(bad.parse::<IfPattern>().is_err(), "`{bad}` parsed");
        }
    }

    #[test]
    fn without_a_pattern_docker_and_loopback_are_left_out_unless_nothing_else_is_up() {
        let chosen: Vec<String> = select(None, &host()).unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(chosen, ["eth0", "eth10"]);
        let only_loopback = &host()[..1];
        assert_eq!(select(None, only_loopback).unwrap()[0].name, "lo");
        assert!(select(None, &[]).is_err());
    }

    #[test]
    fn this_host_lists_its_loopback() {
        let here = interfaces().expect("getifaddrs");
        assert!(here.iter().any(|i| i.name == "lo" && i.addr.is_loopback()), "{here:?}");
    }
}
