//! Topology files: nodes x ranks per node, an alpha and a bandwidth per link class (inside a node, between nodes),
//! the reduction throughput, and optionally an in-network reducing switch. Parsed from JSON with errors that name
//! the field; ranks are numbered node-major (rank r is on node r / ranks_per_node), as torchrun and mpirun do.

use super::fields::Fields;
use serde::Serialize;
use serde_json::Value;

/// Constants of the built-in uniform topology, used when no `--topo` is given. They describe one host of the
/// kind collc is developed on (REFERENCE.md section 3): a shared-memory message costs well under a microsecond to
/// start, and its bytes cross memory twice (into the FIFO and out), at about half the DRAM copy rate.
pub mod defaults {
    /// Shared-memory flag ping-pong is 0.04 us one way; a full message with its slot handshake about 0.5 us.
    pub const ALPHA_US: f64 = 0.5;
    /// DRAM copy runs at 33-41 GB/s and a message is copied twice on its way.
    pub const BANDWIDTH_GBPS: f64 = 16.0;
    /// A vectorised reduction reads two streams and writes one: about the copy rate.
    pub const REDUCE_GBPS: f64 = 16.0;
    /// A small message over TCP sockets (loopback or a veth pair), one way, with its system calls.
    pub const SOCKET_ALPHA_US: f64 = 15.0;
    /// One TCP stream on a host of this class.
    pub const SOCKET_BANDWIDTH_GBPS: f64 = 2.0;
}

/// One link class: the start-up time of a message and the bandwidth of one rank's port, and optionally the
/// measured time of a message of each size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Link {
    /// Microseconds from the start of a send to the first byte arriving (alpha).
    pub alpha_us: f64,
    /// GB/s (1e9 bytes per second) one rank's port sustains in each direction (1 / beta).
    pub bandwidth_gbps: f64,
    /// Measured one-way times of single messages, `[bytes, microseconds]` by growing size: the gap per message
    /// size of the parameterised LogP model (PLogP, Kielmann et al. 2000), for transports whose cost is not linear
    /// in the size (caches, FIFO slots, protocols). Where present, the cost model reads a port's time for `m` bytes
    /// off this curve (`Link::message_seconds`) in place of alpha + m x beta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_us: Option<Vec<[f64; 2]>>,
}

impl Link {
    /// A link with no measured curve: alpha + m x beta at every size.
    pub fn linear(alpha_us: f64, bandwidth_gbps: f64) -> Self {
        Link { alpha_us, bandwidth_gbps, message_us: None }
    }

    pub fn alpha(&self) -> f64 {
        self.alpha_us * 1e-6
    }

    /// Seconds per byte.
    pub fn beta(&self) -> f64 {
        1e-9 / self.bandwidth_gbps
    }

    /// Seconds a message of `bytes` takes on the measured curve: linear between its points, the first point's time
    /// below the first, and the last point's time plus the rest at `bandwidth_gbps` past the last. `None` without
    /// a curve.
    pub fn message_seconds(&self, bytes: f64) -> Option<f64> {
        let curve = self.message_us.as_deref()?;
        let [first, last] = [curve.first()?, curve.last()?];
        let us = if bytes <= first[0] {
            first[1]
        } else if bytes >= last[0] {
            last[1] + (bytes - last[0]) * self.beta() * 1e6
        } else {
            let at = curve.partition_point(|point| point[0] < bytes);
            let ([b0, t0], [b1, t1]) = (curve[at - 1], curve[at]);
            t0 + (t1 - t0) * (bytes - b0) / (b1 - b0)
        };
        Some(us * 1e-6)
    }
}

/// The link classes a message can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkClass {
    Intra,
    Inter,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Links {
    pub intra: Link,
    /// Required when there is more than one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inter: Option<Link>,
}

/// A switch that reduces in the network (CollNet/SHARP between nodes, NVLS inside an NVSwitch node): each rank
/// sends its data up once and receives the reduced result once.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Switch {
    /// Which ranks it connects: `inter` (one port per node, CollNet) or `intra` (the ranks of a node, NVLS).
    pub scope: LinkClass,
    pub alpha_us: f64,
    pub bandwidth_gbps: f64,
}

/// Rates for calls small enough that their data stays in the caches: what a call of at most `max_bytes` bytes
/// (nccl-tests' size) costs per byte on intra-node links, in reductions and in local copies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Cached {
    pub max_bytes: u32,
    pub bandwidth_gbps: f64,
    pub reduce_gbps: f64,
    pub copy_gbps: f64,
}

/// Where a call's data is, by its size: what `Topology::rates` gives the rates of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheRegime {
    /// Larger than the caches: the topology's own rates.
    Memory,
    /// Up to `cached.max_bytes`.
    Cached,
    /// Above that, up to `llc.max_bytes`.
    LastLevel,
}

impl CacheRegime {
    pub(crate) const ALL: [CacheRegime; 3] = [CacheRegime::Memory, CacheRegime::Cached, CacheRegime::LastLevel];
}

/// Seconds per byte of one regime (`Topology::rates`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rates {
    /// Per link class: intra-node, inter-node.
    pub beta: [f64; 2],
    pub gamma: f64,
    pub copy: f64,
}

/// A machine as the cost model sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Topology {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub nodes: u32,
    /// Absent on a one-node topology that fits any rank count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks_per_node: Option<u32>,
    pub links: Links,
    /// GB/s at which one rank reduces (1 / gamma).
    pub reduce_gbps: f64,
    /// GB/s at which one rank copies locally; absent means local copies are free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch: Option<Switch>,
    /// Cores that run one node's ranks; absent means one per rank. With fewer cores than ranks, ranks take turns
    /// on them, so no step finishes before the busiest core has copied and reduced its ranks' bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores_per_node: Option<u32>,
    /// Microseconds from a send to its receive between two ranks on one core: the core changing hands. With fewer
    /// cores than ranks, what each change of hands costs when the schedule is played out on the cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_core_alpha_us: Option<f64>,
    /// Rates of calls that stay in cache; absent means the same rates at every size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached: Option<Cached>,
    /// Rates of larger calls whose data still stays in the last-level cache (above `cached.max_bytes`, up to its
    /// own `max_bytes`); absent means the topology's own rates there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llc: Option<Cached>,
    /// Up to how many bytes (nccl-tests' size) the ranks read each other's memory in place (rank threads of one
    /// process, shm from the ranks' arenas): a send whose source stays until the call ends (the memory model's rule
    /// 8) costs its receiver one local pass over the chunks and the link's alpha, not their bytes through the ports;
    /// a larger call is priced through the FIFOs. `None`: never. Set by the transport that runs the ranks
    /// (`Backend::single_copy_max_bytes`), not by a topology file.
    #[serde(skip)]
    pub single_copy: Option<f64>,
}

/// A topology file that cannot be used, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TopologyError {
    pub field: String,
    pub message: String,
}

pub(super) fn error(field: &str, message: impl Into<String>) -> TopologyError {
    TopologyError { field: field.to_string(), message: message.into() }
}

impl Topology {
    /// One node of `n_ranks` ranks with the built-in constants (see `defaults`).
    pub fn uniform(n_ranks: u32) -> Self {
        let link = Link::linear(defaults::ALPHA_US, defaults::BANDWIDTH_GBPS);
        Topology {
            name: "uniform (built-in)".into(),
            nodes: 1,
            ranks_per_node: Some(n_ranks),
            links: Links { intra: link, inter: None },
            reduce_gbps: defaults::REDUCE_GBPS,
            copy_gbps: None,
            switch: None,
            cores_per_node: None,
            shared_core_alpha_us: None,
            cached: None,
            llc: None,
            single_copy: None,
        }
    }

    /// `n_ranks` ranks in nodes of `per_node` (one node when it does not divide them), every link with the built-in
    /// constants: what a launcher's node split says without a topology file.
    pub fn uniform_nodes(n_ranks: u32, per_node: u32) -> Self {
        let mut topo = Topology::uniform(n_ranks);
        if per_node > 0 && per_node < n_ranks && n_ranks.is_multiple_of(per_node) {
            topo.nodes = n_ranks / per_node;
            topo.ranks_per_node = Some(per_node);
            topo.links.inter = Some(topo.links.intra.clone());
        }
        topo
    }

    /// `n_ranks` ranks that reach each other over TCP sockets (the `tcp` transport), each on a node of its own, with
    /// the built-in socket constants: what `collc run --transport tcp` selects on without a topology file.
    pub fn sockets(n_ranks: u32) -> Self {
        let link = Link::linear(defaults::SOCKET_ALPHA_US, defaults::SOCKET_BANDWIDTH_GBPS);
        Topology {
            name: "sockets (built-in)".into(),
            nodes: n_ranks,
            ranks_per_node: Some(1),
            links: Links { intra: link.clone(), inter: Some(link) },
            ..Topology::uniform(n_ranks)
        }
    }

    /// Parses and checks a topology file's text.
    pub fn from_json(text: &str) -> Result<Self, TopologyError> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            // serde_json's message ends with the place, which the field names already.
            let message = e.to_string();
            let place = format!(" at line {} column {}", e.line(), e.column());
            let message = message.strip_suffix(&place).unwrap_or(&message);
            error(&format!("line {} column {}", e.line(), e.column()), format!("not JSON: {message}"))
        })?;
        let root = Fields::new(
            "",
            &value,
            &[
                "name",
                "nodes",
                "ranks_per_node",
                "links",
                "reduce_gbps",
                "copy_gbps",
                "switch",
                "cores_per_node",
                "shared_core_alpha_us",
                "cached",
                "llc",
            ],
        )?;
        let links = root.object("links", &["intra", "inter"])?;
        let topo = Topology {
            name: root.optional("name", Value::as_str, "a string")?.unwrap_or_default().to_string(),
            nodes: root.count("nodes")?,
            ranks_per_node: root.optional_count("ranks_per_node")?,
            links: Links { intra: links.link("intra")?, inter: links.optional_link("inter")? },
            reduce_gbps: root.number("reduce_gbps")?,
            copy_gbps: root.optional("copy_gbps", Value::as_f64, "a number")?,
            switch: match root.get("switch") {
                None => None,
                Some(_) => {
                    let s = root.object("switch", &["scope", "alpha_us", "bandwidth_gbps"])?;
                    let scope = match s.required("scope", Value::as_str, "\"intra\" or \"inter\"")? {
                        "intra" => LinkClass::Intra,
                        "inter" => LinkClass::Inter,
                        other => {
                            return Err(error(&s.path("scope"), format!("is `{other}`; use \"intra\" or \"inter\"")))
                        }
                    };
                    Some(Switch { scope, alpha_us: s.number("alpha_us")?, bandwidth_gbps: s.number("bandwidth_gbps")? })
                }
            },
            cores_per_node: root.optional_count("cores_per_node")?,
            shared_core_alpha_us: root.optional("shared_core_alpha_us", Value::as_f64, "a number")?,
            cached: root.cached("cached")?,
            llc: root.cached("llc")?,
            single_copy: None,
        };
        topo.validate()?;
        Ok(topo)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a topology always serialises")
    }

    fn validate(&self) -> Result<(), TopologyError> {
        if self.nodes == 0 {
            return Err(error("nodes", "must be at least 1"));
        }
        match self.ranks_per_node {
            Some(0) => return Err(error("ranks_per_node", "must be at least 1")),
            Some(g) if self.nodes.checked_mul(g).is_none() => {
                return Err(error("nodes", "nodes x ranks_per_node overflows"))
            }
            None if self.nodes > 1 => {
                return Err(error("ranks_per_node", format!("is required with {} nodes", self.nodes)))
            }
            _ => {}
        }
        if self.cores_per_node == Some(0) {
            return Err(error("cores_per_node", "must be at least 1"));
        }
        check_link("links.intra", &self.links.intra)?;
        match (&self.links.inter, self.nodes) {
            (Some(link), _) => check_link("links.inter", link)?,
            (None, 1) => {}
            (None, n) => return Err(error("links.inter", format!("is required with {n} nodes"))),
        }
        positive("reduce_gbps", self.reduce_gbps)?;
        if let Some(copy) = self.copy_gbps {
            positive("copy_gbps", copy)?;
        }
        if let Some(alpha) = self.shared_core_alpha_us {
            non_negative("shared_core_alpha_us", alpha)?;
        }
        if let (Some(cached), Some(llc)) = (&self.cached, &self.llc) {
            if llc.max_bytes <= cached.max_bytes {
                return Err(error("llc.max_bytes", "must be above cached.max_bytes"));
            }
        }
        if let Some(llc) = &self.llc {
            positive("llc.bandwidth_gbps", llc.bandwidth_gbps)?;
            positive("llc.reduce_gbps", llc.reduce_gbps)?;
            positive("llc.copy_gbps", llc.copy_gbps)?;
        }
        if let Some(cached) = &self.cached {
            positive("cached.bandwidth_gbps", cached.bandwidth_gbps)?;
            positive("cached.reduce_gbps", cached.reduce_gbps)?;
            positive("cached.copy_gbps", cached.copy_gbps)?;
        }
        if let Some(switch) = &self.switch {
            non_negative("switch.alpha_us", switch.alpha_us)?;
            positive("switch.bandwidth_gbps", switch.bandwidth_gbps)?;
        }
        Ok(())
    }

    /// Checks that the topology describes exactly `n_ranks` ranks.
    pub fn check_ranks(&self, n_ranks: u32) -> Result<(), TopologyError> {
        let Some(per_node) = self.ranks_per_node else { return Ok(()) };
        let total = self.nodes * per_node;
        if total == n_ranks {
            return Ok(());
        }
        Err(error(
            "nodes",
            format!("{} nodes x {per_node} ranks_per_node = {total} ranks, but --ranks is {n_ranks}", self.nodes),
        ))
    }

    /// Whether a node of `n_ranks` ranks has more ranks than cores.
    pub fn shares_cores(&self, n_ranks: u32) -> bool {
        self.cores_per_node.is_some_and(|cores| cores < self.per_node(n_ranks))
    }

    /// The cores a node's ranks run on: `cores_per_node`, at most one per rank (one per rank when not given).
    pub fn cores_used(&self, n_ranks: u32) -> u32 {
        let per_node = self.per_node(n_ranks);
        self.cores_per_node.unwrap_or(per_node).clamp(1, per_node)
    }

    /// The core `rank` runs on, numbered across nodes: a node's ranks are dealt to its cores in turn, local rank l on
    /// core l mod cores, as `collc run` binds them.
    pub fn core_of(&self, rank: u32, n_ranks: u32) -> u32 {
        let cores = self.cores_used(n_ranks);
        self.node_of(rank) * cores + rank % self.per_node(n_ranks) % cores
    }

    /// Ranks per node for `n_ranks` ranks in all.
    pub fn per_node(&self, n_ranks: u32) -> u32 {
        self.ranks_per_node.unwrap_or(n_ranks).max(1)
    }

    pub fn node_of(&self, rank: u32) -> u32 {
        self.ranks_per_node.map_or(0, |g| rank / g)
    }

    pub fn class(&self, from: u32, to: u32) -> LinkClass {
        if self.node_of(from) == self.node_of(to) {
            LinkClass::Intra
        } else {
            LinkClass::Inter
        }
    }

    pub fn link(&self, class: LinkClass) -> &Link {
        match class {
            LinkClass::Intra => &self.links.intra,
            LinkClass::Inter => self.links.inter.as_ref().unwrap_or(&self.links.intra),
        }
    }

    /// Seconds per byte of the topology's rates in `regime`: its own (`Regime::Memory`), or its cached or last-level
    /// cache rates where it has them (inter-node links keep their own).
    pub(crate) fn rates(&self, regime: CacheRegime) -> Rates {
        let links = [self.link(LinkClass::Intra), self.link(LinkClass::Inter)];
        let rates = match regime {
            CacheRegime::Memory => None,
            CacheRegime::Cached => self.cached,
            CacheRegime::LastLevel => self.llc,
        };
        match rates {
            Some(c) => Rates {
                beta: [1e-9 / c.bandwidth_gbps, links[1].beta()],
                gamma: 1e-9 / c.reduce_gbps,
                copy: 1e-9 / c.copy_gbps,
            },
            None => Rates { beta: [links[0].beta(), links[1].beta()], gamma: self.gamma(), copy: self.copy_beta() },
        }
    }

    /// Seconds per byte reduced.
    pub fn gamma(&self) -> f64 {
        1e-9 / self.reduce_gbps
    }

    /// Seconds per byte copied locally.
    pub fn copy_beta(&self) -> f64 {
        self.copy_gbps.map_or(0.0, |gbps| 1e-9 / gbps)
    }

    /// What report headers call the topology: its `name`, or `file` for a file that gives none.
    pub fn title(&self) -> &str {
        if self.name.is_empty() {
            "file"
        } else {
            &self.name
        }
    }

    /// One line for report headers.
    pub fn describe(&self) -> String {
        let link = |l: &Link| match &l.message_us {
            Some(curve) => {
                format!("alpha {} us, {} GB/s, measured at {} message sizes", l.alpha_us, l.bandwidth_gbps, curve.len())
            }
            None => format!("alpha {} us, {} GB/s", l.alpha_us, l.bandwidth_gbps),
        };
        let per_node = self.ranks_per_node.map_or("any number of".to_string(), |g| g.to_string());
        let mut text = format!("{} node(s) x {per_node} ranks; intra {}", self.nodes, link(&self.links.intra));
        if let Some(inter) = &self.links.inter {
            text += &format!("; inter {}", link(inter));
        }
        text += &format!("; reduce {} GB/s", self.reduce_gbps);
        if let Some(copy) = self.copy_gbps {
            text += &format!("; copy {copy} GB/s");
        }
        if let Some(cores) = self.cores_per_node {
            text += &format!("; {cores} cores per node");
        }
        if let Some(alpha) = self.shared_core_alpha_us {
            text += &format!("; alpha {alpha} us between ranks on one core");
        }
        for c in [&self.cached, &self.llc].into_iter().flatten() {
            text += &format!(
                "; up to {} B: {} GB/s, reduce {} GB/s, copy {} GB/s",
                c.max_bytes, c.bandwidth_gbps, c.reduce_gbps, c.copy_gbps
            );
        }
        if let Some(s) = &self.switch {
            text += &format!("; reducing switch ({:?}) alpha {} us, {} GB/s", s.scope, s.alpha_us, s.bandwidth_gbps);
        }
        text
    }
}

fn positive(field: &str, value: f64) -> Result<(), TopologyError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(error(field, format!("must be a positive number of GB/s, not {value}")))
    }
}

fn non_negative(field: &str, value: f64) -> Result<(), TopologyError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(error(field, format!("must be zero or more microseconds, not {value}")))
    }
}

fn check_link(field: &str, link: &Link) -> Result<(), TopologyError> {
    non_negative(&format!("{field}.alpha_us"), link.alpha_us)?;
    let mut smaller = None;
    for (i, &[bytes, us]) in link.message_us.iter().flatten().enumerate() {
        let at = format!("{field}.message_us[{i}]");
        if !(bytes.is_finite() && bytes >= 0.0) || smaller.is_some_and(|b| bytes <= b) {
            return Err(error(&at, format!("{bytes} bytes: sizes must be zero or more and grow from point to point")));
        }
        non_negative(&at, us)?;
        smaller = Some(bytes);
    }
    positive(&format!("{field}.bandwidth_gbps"), link.bandwidth_gbps)
}
