//! Timings measured on this host, which the choice learns from: `collc run COLLECTIVE --compare` times every
//! candidate at every size and merges the out-of-place times here (a file beside the host's calibration), per
//! collective, rank count and transport; each point keeps the last `RUNS_KEPT` runs' times and stands for their
//! median, so one noisy run does not turn the choice. A selection whose ranks are all on this host, costed without a topology
//! file, then chooses by them at a call size every candidate was timed around (log-log interpolation between the
//! two sizes timed nearest), and by the cost model elsewhere.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Runs whose times a point keeps.
pub const RUNS_KEPT: usize = 5;

/// One candidate's time at one size: the median of the runs kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub algorithm: String,
    pub bytes: u64,
    pub seconds: f64,
    /// The times of the last runs (at most `RUNS_KEPT`), oldest first.
    #[serde(default)]
    pub runs: Vec<f64>,
}

/// The timings of one collective on so many ranks over one transport.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub collective: String,
    pub ranks: u32,
    pub transport: String,
    pub points: Vec<Point>,
}

/// Every timing merged on this host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub series: Vec<Series>,
}

impl Point {
    /// `algorithm`'s time at `bytes`, as one run measured it.
    pub fn new(algorithm: &str, bytes: u64, seconds: f64) -> Point {
        Point { algorithm: algorithm.to_string(), bytes, seconds, runs: Vec::new() }
    }
}

impl Measured {
    /// Merges `points` into the file's timings of (`collective`, `ranks`, `transport`) and writes it back: what a
    /// `--compare` run or a communicator learning from live calls keeps. Where the file went.
    pub fn keep(collective: &str, ranks: u32, transport: &str, points: Vec<Point>) -> Result<PathBuf, String> {
        let mut measured = Measured::load();
        measured.merge(collective, ranks, transport, points);
        measured.save()
    }

    /// The file beside the host's calibration (`host_cache_path`), `...-measured.json`.
    pub fn path() -> Option<PathBuf> {
        let calibration = super::host_cache_path()?;
        Some(calibration.with_extension("measured.json"))
    }

    /// What the file holds (nothing when it is missing or does not read).
    pub fn load() -> Measured {
        Measured::path()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    /// Adds `points` to the series of (`collective`, `ranks`, `transport`): each one's time joins the runs of the
    /// point of the same algorithm and size (the oldest dropped beyond `RUNS_KEPT`), which then stands for their
    /// median.
    pub fn merge(&mut self, collective: &str, ranks: u32, transport: &str, points: Vec<Point>) {
        let found =
            self.series.iter().position(|s| s.collective == collective && s.ranks == ranks && s.transport == transport);
        let index = found.unwrap_or_else(|| {
            let series =
                Series { collective: collective.into(), ranks, transport: transport.into(), points: Vec::new() };
            self.series.push(series);
            self.series.len() - 1
        });
        let series = &mut self.series[index];
        for point in points.into_iter().filter(|p| p.seconds.is_finite() && p.seconds > 0.0) {
            let at = series.points.iter().position(|p| p.algorithm == point.algorithm && p.bytes == point.bytes);
            let mut runs = at.map(|i| series.points.swap_remove(i).runs).unwrap_or_default();
            runs.push(point.seconds);
            if runs.len() > RUNS_KEPT {
                runs.remove(0);
            }
            let mut sorted = runs.clone();
            sorted.sort_by(f64::total_cmp);
            let seconds = sorted[sorted.len() / 2];
            series.points.push(Point { seconds, runs, ..point });
        }
        series.points.sort_by(|a, b| (a.algorithm.as_str(), a.bytes).cmp(&(b.algorithm.as_str(), b.bytes)));
    }

    /// Writes the file (through a temporary one renamed over it, so a reader never sees half of it).
    pub fn save(&self) -> Result<PathBuf, String> {
        let path = Measured::path().ok_or("no cache folder: set XDG_CACHE_HOME or HOME")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let temporary = path.with_extension(format!("json.{}", std::process::id()));
        std::fs::write(&temporary, text).map_err(|e| format!("{}: {e}", temporary.display()))?;
        std::fs::rename(&temporary, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// The series of (`collective`, `ranks`, `transport`), if any.
    pub fn series(&self, collective: &str, ranks: u32, transport: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.collective == collective && s.ranks == ranks && s.transport == transport)
    }
}

impl Series {
    /// `algorithm`'s time at `bytes`: between the two sizes timed nearest it (log-log), exact at a size timed;
    /// `None` outside the sizes timed.
    pub fn seconds(&self, algorithm: &str, bytes: f64) -> Option<f64> {
        let points: Vec<&Point> = self.points.iter().filter(|p| p.algorithm == algorithm).collect();
        let above = points.iter().position(|p| p.bytes as f64 >= bytes)?;
        let high = points[above];
        if high.bytes as f64 == bytes || above == 0 {
            return (high.bytes as f64 == bytes).then_some(high.seconds);
        }
        let low = points[above - 1];
        let (x0, x1) = ((low.bytes.max(1) as f64).ln(), (high.bytes.max(1) as f64).ln());
        let t = ((bytes.max(1.0)).ln() - x0) / (x1 - x0);
        Some((low.seconds.ln() + t * (high.seconds.ln() - low.seconds.ln())).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::{Measured, Point};

    fn point(algorithm: &str, bytes: u64, seconds: f64) -> Point {
        Point::new(algorithm, bytes, seconds)
    }

    /// A merge adds to the same algorithm's runs at the same size (the point is their median) and keeps the rest; a
    /// time is exact at a size timed, between the two nearest elsewhere, and unknown outside the sizes timed.
    #[test]
    fn merged_timings_replace_their_own_and_interpolate_between_sizes() {
        let mut measured = Measured::default();
        measured.merge("allreduce", 4, "threads", vec![point("ring", 1024, 4e-6), point("ring", 4096, 16e-6)]);
        measured.merge("allreduce", 4, "threads", vec![point("ring", 4096, 8e-6), point("tree", 1024, 1e-6)]);
        measured.merge("allreduce", 4, "threads", vec![point("ring", 4096, 7e-6)]);
        measured.merge("allreduce", 8, "threads", vec![point("ring", 1024, 1.0)]);
        let series = measured.series("allreduce", 4, "threads").expect("merged");
        assert_eq!(series.points.len(), 3);
        // The median of 16, 8 and 7 us.
        assert_eq!(series.seconds("ring", 4096.0), Some(8e-6));
        for run in 0..super::RUNS_KEPT {
            measured.merge("allreduce", 4, "threads", vec![point("ring", 4096, 8e-6 + run as f64 * 1e-9)]);
        }
        let series = measured.series("allreduce", 4, "threads").expect("merged");
        let ring = series.points.iter().find(|p| p.algorithm == "ring" && p.bytes == 4096).expect("kept");
        assert_eq!(ring.runs.len(), super::RUNS_KEPT);
        assert_eq!(series.seconds("ring", 4096.0), Some(8e-6 + 2e-9));
        let between = series.seconds("ring", 2048.0).expect("between two sizes timed");
        assert!((between - (4e-6 * (8e-6 + 2e-9f64)).sqrt()).abs() < 1e-12, "{between}");
        assert_eq!(series.seconds("ring", 512.0), None);
        assert_eq!(series.seconds("ring", 8192.0), None);
        assert_eq!(series.seconds("tree", 1024.0), Some(1e-6));
        assert_eq!(measured.series("allreduce", 8, "threads").map(|s| s.points.len()), Some(1));
    }
}
