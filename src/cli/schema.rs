//! `runbook schema`: the JSON Schema of a document kind, or the field
//! reference made from the schemas.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::schema::{self, DocKind};

#[derive(clap::Args, Debug)]
pub struct SchemaArgs {
    /// Policy, AlertRoutes or Scenario (any case).
    #[arg(required_unless_present_any = ["reference", "functions", "out_dir"])]
    pub kind: Option<String>,
    /// Print the Markdown reference of every document (docs/reference.md).
    #[arg(long, conflicts_with_all = ["kind", "out_dir", "functions"])]
    pub reference: bool,
    /// Print the Markdown reference of the functions a script can call
    /// (docs/script-functions.md).
    #[arg(long, conflicts_with_all = ["kind", "out_dir"])]
    pub functions: bool,
    /// Write every kind's schema into this directory (KIND.schema.json).
    #[arg(long, conflicts_with = "kind")]
    pub out_dir: Option<PathBuf>,
}

pub fn run(args: SchemaArgs) -> anyhow::Result<ExitCode> {
    if args.reference {
        print!("{}", schema::reference());
        return Ok(ExitCode::SUCCESS);
    }
    if args.functions {
        print!("{}", runbook_core::script::reference::markdown());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = args.out_dir {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for kind in DocKind::ALL {
            let path = dir.join(kind.file_name());
            std::fs::write(&path, schema::schema_text(kind))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let kind =
        DocKind::parse(args.kind.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
    print!("{}", schema::schema_text(kind));
    Ok(ExitCode::SUCCESS)
}
