//! Which bindings `collc check` verifies at a rank count: the roots `--root` asks for (every root up to
//! `EXACT_AUTO_RANKS` ranks, a spread drawn from the invocation's seed above), sendrecv's peers, and the node
//! splits `--set` leaves open, each named as the lines print it.

use super::{Binding, CheckArgs};
use collc_compiler::lower::node_split;
use collc_compiler::verify::EXACT_AUTO_RANKS;
use collc_compiler::{Bindings, Collective, Seed};
use collc_grammar::ast;

/// Which roots `--root` asks for.
pub(super) enum Roots {
    /// Every root up to `EXACT_AUTO_RANKS` ranks, a spread above.
    Default,
    All,
    List(Vec<u32>),
}

/// `all` or `N,M,..`.
pub(super) fn parse_roots(text: Option<&str>) -> Result<Roots, String> {
    match text.map(str::trim) {
        None => Ok(Roots::Default),
        Some("all") => Ok(Roots::All),
        Some(list) => list
            .split(',')
            .map(|n| {
                n.trim().parse::<u32>().map_err(|_| format!("`{n}` in `{list}` is not a rank; write all or N,M,.."))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Roots::List),
    }
}

/// Up to `EXACT_AUTO_RANKS` ranks every root; above, 0, 1, p/2, p-1 and four roots drawn from the invocation's
/// seed (fresh from the OS unless `--seed` replays one, exact runs included, so no fixed sample can be fitted; from
/// a stream of their own, independent of the key).
pub(super) fn root_spread(p: u32, seed: Seed) -> Vec<u32> {
    if p <= EXACT_AUTO_RANKS {
        return (0..p).collect();
    }
    let mut roots = vec![0, 1, p / 2, p - 1];
    roots.extend(collc_compiler::verify::key::draw_ranks(seed, p, 4));
    roots.sort_unstable();
    roots.dedup();
    roots
}

/// The (root, peer) pairs to check at `p`: for a collective without a root, the listed roots if any; for
/// sendrecv without `--peer`, every destination up to 16 ranks, and the neighbours and the opposite rank above.
pub(super) fn roots_and_peers(
    collective: Option<Collective>,
    p: u32,
    args: &CheckArgs,
    roots: &Roots,
    seed: Seed,
) -> Vec<(Option<u32>, Option<u32>)> {
    let Some(collective) = collective.filter(|c| c.rooted()) else {
        // Without a root to sweep, a listed `--root` is still bound (and must be a rank of p, as lowering checks).
        return match roots {
            Roots::List(list) => list.iter().map(|&root| (Some(root), args.params.peer)).collect(),
            Roots::Default | Roots::All => vec![(None, args.params.peer)],
        };
    };
    let roots = match roots {
        Roots::Default => root_spread(p, seed),
        Roots::All => (0..p).collect(),
        Roots::List(list) => list.clone(),
    };
    let peers = |root: u32| -> Vec<Option<u32>> {
        if collective != Collective::SendRecv || args.params.peer.is_some() {
            return vec![args.params.peer];
        }
        let mut peers: Vec<u32> = match p <= 16 {
            true => (0..p).collect(),
            false => vec![(root + 1) % p, (root + p - 1) % p, (root + p / 2) % p],
        };
        peers.retain(|&q| q != root);
        peers.sort_unstable();
        peers.dedup();
        if peers.is_empty() {
            return vec![None];
        }
        peers.into_iter().map(Some).collect()
    };
    roots.into_iter().flat_map(|root| peers(root).into_iter().map(move |peer| (Some(root), peer))).collect()
}

/// The bindings to check at `n_ranks`: each root (and peer) asked for, and for an algorithm with a node split
/// that `--set` leaves open every ranks-per-node count that divides `n_ranks`, each named (`root=3 n=2 g=4`).
pub(super) fn bindings(file: &ast::File, args: &CheckArgs, roots: &Roots, seed: Seed, n_ranks: u32) -> Vec<Binding> {
    let collective = file.algorithm.collective.name.parse::<Collective>().ok();
    // A root is named where several are checked: a rooted collective's, or a list given for one without a root.
    let sweep = collective.is_some_and(|c| c.rooted()) || matches!(roots, Roots::List(list) if list.len() > 1);
    let mut out = Vec::new();
    for (root, peer) in roots_and_peers(collective, n_ranks, args, roots, seed) {
        let given = Bindings { peer, ..args.params.bindings(n_ranks, root) };
        let named_root = root.filter(|_| sweep);
        let named_peer = peer.filter(|_| sweep && collective == Some(Collective::SendRecv));
        let mut name = match (named_root, named_peer) {
            (Some(root), Some(peer)) => format!("root={root} peer={peer}"),
            (Some(root), None) => format!("root={root}"),
            _ => String::new(),
        };
        let binding = |name: String, split: String, bindings: Bindings| Binding {
            name,
            split,
            root: named_root,
            peer: named_peer,
            bindings,
        };
        let open = node_split(&file.algorithm)
            .filter(|(nodes, local)| !given.params.iter().any(|(n, _)| n == nodes || n == local));
        let Some((nodes, local)) = open else {
            out.push(binding(name, String::new(), given));
            continue;
        };
        if !name.is_empty() {
            name.push(' ');
        }
        for g in (1..=n_ranks).filter(|g| n_ranks.is_multiple_of(*g)) {
            let split = format!("{nodes}={} {local}={g}", n_ranks / g);
            out.push(binding(format!("{name}{split}"), split, given.clone().with_default_split(&file.algorithm, g)));
        }
    }
    out
}
