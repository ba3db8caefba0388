//! `collc cost`, `collc tune` and `collc run COLLECTIVE` as a user runs them: tables, JSON, the selection, and
//! clear errors for bad topology files, unknown algorithm names and empty size ranges.

mod common;

use common::{TempDir, TempFile};
use std::process::{Command, Output};

thread_local! {
    /// The calibration cache of the test running on this thread, removed when it ends.
    static CACHE: TempDir = TempDir::new(&format!("cache-{:?}", std::thread::current().id()).replace(['(', ')'], ""));
}

/// The calibration cache of this test (`$XDG_CACHE_HOME`): `collc run COLLECTIVE` calibrates this host on first use
/// and caches it; the tests keep it out of the user's home, and each test has its own (timings merged by one
/// `--compare` do not steer another test's choice).
fn cache() -> std::path::PathBuf {
    CACHE.with(|dir| dir.path().to_path_buf())
}

fn collc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc")).args(args).env("XDG_CACHE_HOME", cache()).output().expect("collc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_topology(name: &str, body: &str) -> TempFile {
    TempFile::with(&format!("{name}.json"), body)
}

const TWO_LEVEL: &str = r#"{"nodes": 2, "ranks_per_node": 4,
  "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 100}, "inter": {"alpha_us": 5, "bandwidth_gbps": 10}},
  "reduce_gbps": 50}"#;

#[test]
fn cost_prints_time_and_bandwidths_per_size_and_json() {
    let out = collc(&["cost", "allreduce/ring", "--ranks", "4", "--sizes", "1K..1M", "-f", "32"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(stdout.contains("6 steps"), "{stdout}");
    let out = collc(&["cost", "allreduce/ring", "--ranks", "4", "--sizes", "8..8", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let row = &doc["rows"][0];
    // 6 steps of alpha 0.5 us (the built-in constants) dominate 8 bytes.
    let time = row["time_us"].as_f64().expect("time");
    assert!((3.0..3.1).contains(&time), "{doc}");
}

#[test]
fn tune_on_a_two_level_topology_picks_the_hierarchy_for_large_messages() {
    let topo = write_topology("two-level", TWO_LEVEL);
    let out = collc(&["tune", "allreduce", "--ranks", "8", "--topo", topo.path(), "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ranges = doc["collectives"][0]["ranges"].as_array().expect("ranges");
    assert_eq!(ranges.first().expect("one")["algorithm"], "one_shot", "{doc}");
    assert_eq!(ranges.last().expect("one")["algorithm"], "hierarchical", "{doc}");
    // A filter for some collectives leaves the others out of a tune of them all, saying so.
    let out = collc(&["tune", "--ranks", "8", "--topo", topo.path(), "--algo", "ring,binomial"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("# alltoall: skipped"), "{}", text(&out.stdout));
    let out = collc(&["tune", "--ranks", "8", "--topo", topo.path()]);
    let stdout = text(&out.stdout);
    for collective in
        ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "gather", "scatter", "alltoall"]
    {
        assert!(stdout.contains(&format!("# {collective}: candidates")), "{stdout}");
    }
}

/// `collc run` with its calibration cache in `cache` (as `$XDG_CACHE_HOME`).
fn run_cached(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc")).args(args).env("XDG_CACHE_HOME", cache).output().expect("collc runs")
}

#[test]
fn run_with_a_collective_says_what_it_selected_and_checks_it() {
    // A cache of its own: the first run must find none.
    let first_use = cache().join("first-use");
    let args = ["run", "allreduce", "--ranks", "3", "-b", "8", "-e", "1M", "-f", "64", "-n", "2", "-w", "1"];
    let out = run_cached(&first_use, &args);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("selected per size") && stdout.contains("(predicted fastest)"), "{stdout}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    // Without a topology file it calibrates this host on first use, says so, and reads the cache after that.
    assert!(stdout.contains("#   cost model on this host, calibrated now ("), "{stdout}");
    let again = text(&run_cached(&first_use, &args).stdout);
    assert!(again.contains("#   cost model on this host's calibration, cached in "), "{again}");
    let _ = std::fs::remove_dir_all(&first_use);
    let out = collc(&["run", "allreduce", "--ranks", "3", "-b", "8", "-e", "64", "--algo", "ring", "-n", "2"]);
    assert!(text(&out.stdout).contains("sizes 8..=64: allreduce/ring"), "{}", text(&out.stdout));
    let topo = write_topology(
        "run-topo",
        r#"{"nodes": 1, "links": {"intra": {"alpha_us": 2, "bandwidth_gbps": 5}}, "reduce_gbps": 5}"#,
    );
    let out =
        collc(&["run", "allreduce", "--ranks", "3", "-e", "64", "-n", "2", "--topo", topo.path(), "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let on = doc["topology"].as_str().expect("the topology it selected on");
    assert!(
        on.starts_with(&format!("--topo {}: 1 node(s) x any number of ranks; intra alpha 2 us, 5 GB/s", topo.path())),
        "{on}"
    );
    let env = Command::new(env!("CARGO_BIN_EXE_collc"))
        .env("XDG_CACHE_HOME", cache())
        .args(["run", "broadcast", "--ranks", "3", "-b", "8", "-e", "64", "-n", "2"])
        .env("COLLC_ALGO", "allreduce:ring;broadcast:chain")
        .output()
        .expect("collc runs");
    assert!(text(&env.stdout).contains("broadcast/chain"), "{}", text(&env.stdout));
}

/// `--compare` times every candidate at every size in one launch, checks each, and names the measured fastest
/// beside the cost model's choice; in JSON exactly one row per size is the predicted one.
#[test]
fn run_compare_times_every_candidate_at_every_size() {
    let base = ["run", "allreduce", "--ranks", "3", "--compare", "--algo", "ring,one_shot,tree", "-b", "8", "-e", "4K"];
    let out = collc(&[&base[..], &["-f", "8", "-n", "2", "-w", "1"]].concat());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    for algorithm in ["allreduce/ring", "allreduce/one_shot", "allreduce/tree"] {
        let rows = stdout.lines().filter(|l| !l.starts_with('#') && l.ends_with(&format!("  {algorithm}"))).count();
        assert_eq!(rows, 4, "{algorithm}: one row per size (8, 64, 512, 4096)\n{stdout}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    assert_eq!(stdout.matches(" B float sum  fastest allreduce/").count(), 4, "{stdout}");
    assert!(stdout.contains("within 10% of the measured fastest at "), "{stdout}");
    assert!(stdout.contains(" of 4 sizes"), "{stdout}");

    let out = collc(&[&base[..], &["-f", "8", "-n", "2", "-w", "1", "--format", "json"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 12, "{doc}");
    for size in [8, 64, 512, 4096] {
        let predicted = rows.iter().filter(|r| r["size"] == size && r["predicted"] == true).count();
        assert_eq!(predicted, 1, "size {size}: {doc}");
    }
}

/// What `--compare` measures on this host is merged into its timings, and a later selection of the same candidates
/// on as many ranks over the transport chooses, at every size it timed, the measured fastest or a candidate timed
/// within the noise of it (the cost model beyond).
#[test]
fn the_choice_learns_what_compare_measured() {
    let cache = cache().join("learns");
    let _ = std::fs::remove_dir_all(&cache);
    let sizes = ["-b", "1K", "-e", "64K", "-f", "4", "-n", "3", "-w", "1"];
    let compare =
        [&["run", "allreduce", "--ranks", "3", "--algo", "ring,one_shot,two_shot", "--compare"][..], &sizes].concat();
    let out = run_cached(&cache, &compare);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("# merged 12 timings into ") && stdout.contains("allreduce on 3 ranks over threads"),
        "{stdout}"
    );
    // Each candidate's out-of-place time per size, from the compare table's rows.
    let mut timed: std::collections::HashMap<(u64, String), f64> = Default::default();
    for line in stdout.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let (Some(size), Some(time), Some(name)) = (fields.first(), fields.get(5), fields.last()) {
            if let (Ok(size), Ok(time)) = (size.parse::<u64>(), time.parse::<f64>()) {
                timed.insert((size, name.to_string()), time);
            }
        }
    }
    assert_eq!(timed.len(), 12, "{stdout}");
    let run =
        [&["run", "allreduce", "--ranks", "3", "--algo", "ring,one_shot,two_shot", "--format", "json"][..], &sizes]
            .concat();
    let out = run_cached(&cache, &run);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // The choice at each size timed is the fastest, or the model's where that one was timed within the noise.
    for row in doc["rows"].as_array().expect("rows") {
        let size = row["size"].as_u64().expect("a size");
        let chosen = row["algorithm"].as_str().expect("an algorithm");
        let fastest = timed.iter().filter(|((s, _), _)| *s == size).map(|(_, &t)| t).fold(f64::INFINITY, f64::min);
        let time = timed[&(size, chosen.to_string())];
        assert!(
            time <= fastest * (1.0 + collc_runtime::select::NOISE) + 1e-9,
            "{size} B: {chosen} {time} us, fastest {fastest} us"
        );
    }
    let table = text(
        &run_cached(
            &cache,
            &[&[
                "run",
                "allreduce",
                "--ranks",
                "3",
                "--algo",
                "ring,one_shot,two_shot",
                "-b",
                "256",
                "-e",
                "64K",
                "-f",
                "4",
                "-n",
                "1",
            ][..]]
            .concat(),
        )
        .stdout,
    );
    // 256 B was not timed: the model's; a size where the model's choice was timed beyond the noise: the timings'.
    assert!(table.contains("#   sizes 256..=") && table.contains("(predicted fastest)"), "{table}");
    // (The ratios are printed to two decimals: one within a hundredth of the noise says nothing either way.)
    let ratios: Vec<f64> =
        stdout.lines().filter_map(|l| l.rsplit_once(" (")?.1.strip_suffix("x)")?.parse::<f64>().ok()).collect();
    let (noise, learned) = (1.0 + collc_runtime::select::NOISE, table.contains("(measured fastest on this host)"));
    if ratios.iter().any(|&r| r > noise + 0.01) {
        assert!(learned, "{stdout}\n{table}");
    } else if ratios.iter().all(|&r| r < noise - 0.01) {
        assert!(!learned, "{stdout}\n{table}");
    }
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn bad_input_is_a_usage_error_naming_what_is_wrong() {
    let zero = write_topology(
        "zero",
        r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 0}}, "reduce_gbps": 1}"#,
    );
    let two_level = write_topology("mismatch", TWO_LEVEL);
    let truncated = write_topology("truncated", "{\"nodes\": 1,\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["cost", "allreduce/ring", "--topo", zero.path()], "links.intra.bandwidth_gbps"),
        (
            vec!["cost", "allreduce/ring", "--topo", truncated.path()],
            "line 2 column 0: not JSON: EOF while parsing a value\n",
        ),
        (vec!["cost", "allreduce/ring", "--ranks", "6", "--topo", two_level.path()], "--ranks is 6"),
        (vec!["cost", "allreduce/ring", "--sizes", "1M..8"], "empty"),
        (vec!["cost", "allreduce/ring", "--sizes", "abc"], "not a range"),
        (vec!["tune", "--ranks", "0"], "at least one rank"),
        (vec!["cost", "allreduce/nope"], "neither a library algorithm nor a file"),
        (vec!["tune", "allreduce", "--algo", "rign"], "`rign` is not an algorithm"),
        (vec!["run", "allreduce", "--algo", "tree,nope"], "`nope` is not an algorithm"),
        (vec!["run", "allreduce/ring", "--algo", "tree"], "already names one"),
        (vec!["run", "allreduce/ring", "--compare"], "--compare times the candidates of a collective"),
        (vec!["run", "broadcast", "--algo", "ring"], "leaves no broadcast algorithm"),
        (vec!["tune", "broadcast", "--algo", "ring"], "leaves no broadcast algorithm"),
    ];
    for (args, needle) in cases {
        let out = collc(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: `{needle}` not in {stderr}");
    }
}

#[test]
fn calibrate_writes_a_topology_that_cost_accepts() {
    let file = TempFile::named("calibrated.json");
    let path = file.path();
    let out = collc(&["cost", "--calibrate", "--runs", "1", "--output", path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = collc(&["cost", "allreduce/ring", "--ranks", "5", "--topo", path, "--sizes", "8..1K"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("written")).expect("JSON");
    for field in ["alpha_us", "bandwidth_gbps"] {
        assert!(doc["links"]["intra"][field].as_f64().is_some_and(|v| v > 0.0), "{doc}");
    }
    // The measured message curve: every ping-pong size, growing from 8 B to 16 MiB, each with a positive time.
    let curve = doc["links"]["intra"]["message_us"].as_array().expect("a measured curve");
    let points: Vec<(f64, f64)> =
        curve.iter().map(|p| (p[0].as_f64().expect("bytes"), p[1].as_f64().expect("us"))).collect();
    assert_eq!(points.len(), 16, "{doc}");
    assert_eq!((points[0].0, points[15].0), (8.0, 16777216.0), "{doc}");
    assert!(points.windows(2).all(|w| w[0].0 < w[1].0) && points.iter().all(|p| p.1 > 0.0), "{doc}");
}

#[test]
fn a_topology_from_the_environment_is_named_by_its_variable() {
    let zero = write_topology(
        "zero-env",
        r#"{"nodes": 1, "links": {"intra": {"alpha_us": 1, "bandwidth_gbps": 0}}, "reduce_gbps": 1}"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_collc"))
        .env("XDG_CACHE_HOME", cache())
        .args(["run", "allreduce", "--ranks", "2", "-b", "8", "-e", "64"])
        .env("COLLC_TOPO", zero.path())
        .output()
        .expect("collc runs");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("COLLC_TOPO={}: links.intra.bandwidth_gbps", zero.path())), "{stderr}");
}

#[test]
fn cost_says_how_many_slices_a_pipelined_algorithm_is_costed_with() {
    let header = |args: &[&str]| text(&collc(args).stdout).lines().next().unwrap_or_default().to_string();
    let tree = header(&["cost", "allreduce/tree", "--ranks", "8", "--sizes", "1K..1K"]);
    assert!(tree.contains("pipelined in 8 slices per chunk"), "{tree}");
    let unpipelined = header(&["cost", "allreduce/tree", "--ranks", "8", "--sizes", "1K..1K", "--pipeline", "1"]);
    assert!(!unpipelined.contains("pipelined"), "{unpipelined}");
}
