//! The log subscriber `runbook run` installs: `RUNBOOK_LOG` (an
//! `EnvFilter`, default `info`), text or JSON lines. Benchmarks and tests
//! run the operator under the same one, so what logging costs (its span
//! bookkeeping at every reconcile) is measured and its faults are seen.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::registry::LookupSpan;

fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("RUNBOOK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Text lines to `writer`, without colours.
pub fn text<W>(writer: W) -> impl tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    text_with(writer, false)
}

/// Text lines to `writer`, in colours when `colour` (a terminal).
pub fn text_with<W>(
    writer: W,
    colour: bool,
) -> impl tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(writer)
        .with_ansi(colour)
        .finish()
}

/// JSON lines to `writer`.
pub fn json<W>(writer: W) -> impl tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(writer)
        .json()
        .finish()
}
