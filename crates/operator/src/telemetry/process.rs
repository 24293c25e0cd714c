//! The process's own metrics, read from `/proc` at each scrape, under the
//! names every Prometheus client uses (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`): the dashboards and
//! alerts written for them work on Runbook. Off Linux, none is said.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `/proc` reports times in clock ticks of this many per second on every
/// Linux architecture (the user-space ABI's `USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What `/proc` says of this process.
#[derive(Debug, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub start_time_seconds: Option<f64>,
}

/// The fields of `/proc/self/stat` after the command's name (which may
/// hold spaces and parentheses), numbered from 3 as proc(5) does.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

/// A field of `/proc/self/stat` by its number in proc(5).
fn field(fields: &[&str], n: usize) -> Option<f64> {
    fields.get(n.checked_sub(3)?)?.parse().ok()
}

/// `Max open files` of `/proc/self/limits`: its soft limit.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: when the machine booted, in seconds since the
/// epoch.
fn boot_time(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Read from the texts of `/proc/self/stat`, `/proc/stat` and
/// `/proc/self/limits`, the number of open descriptors and the page size.
pub fn sample_from(
    self_stat: &str,
    stat: &str,
    limits: &str,
    open_fds: Option<usize>,
    page_size: f64,
) -> Sample {
    let f = stat_fields(self_stat);
    let ticks = |n| field(&f, n).map(|t| t / TICKS_PER_SECOND);
    Sample {
        cpu_seconds: ticks(14).zip(ticks(15)).map(|(u, s)| u + s),
        virtual_bytes: field(&f, 23),
        resident_bytes: field(&f, 24).map(|pages| pages * page_size),
        open_fds: open_fds.map(|n| n as f64),
        max_fds: max_open_files(limits),
        start_time_seconds: boot_time(stat).zip(ticks(22)).map(|(b, s)| b + s),
    }
}

/// This process, now.
pub fn sample() -> Sample {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count().saturating_sub(1));
    // The page size of every architecture Runbook ships for.
    sample_from(
        &read("/proc/self/stat"),
        &read("/proc/stat"),
        &read("/proc/self/limits"),
        fds,
        4096.0,
    )
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample();
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?;
            c.encode(m)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(m)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_are_read_as_prometheus_names_them() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let self_stat = "4242 (run book) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 12345 104857600 2560 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        let s = sample_from(self_stat, stat, limits, Some(12), 4096.0);
        assert_eq!(s.cpu_seconds, Some(3.0));
        assert_eq!(s.virtual_bytes, Some(104857600.0));
        assert_eq!(s.resident_bytes, Some(2560.0 * 4096.0));
        assert_eq!(s.open_fds, Some(12.0));
        assert_eq!(s.max_fds, Some(1048576.0));
        assert_eq!(s.start_time_seconds, Some(1700000000.0 + 123.45));
    }

    #[test]
    fn unreadable_texts_say_nothing() {
        assert_eq!(sample_from("", "", "", None, 4096.0), Sample::default());
    }

    #[test]
    fn this_process_is_measured_on_linux() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let s = sample();
        assert!(s.resident_bytes.is_some_and(|b| b > 0.0), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 1.0), "{s:?}");
        assert!(s.start_time_seconds.is_some_and(|t| t > 1.0e9), "{s:?}");
    }
}
