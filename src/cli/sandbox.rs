//! `runbook sandbox`: serve the in-memory API server on 127.0.0.1 and write
//! a kubeconfig for it, so kubectl (or `runbook run`) can talk to it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use runbook_sandbox::Sandbox;

#[derive(clap::Args, Debug)]
pub struct SandboxArgs {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0, env = "RUNBOOK_SANDBOX_PORT")]
    pub port: u16,
    /// Write a kubeconfig for the sandbox here.
    #[arg(long, env = "RUNBOOK_SANDBOX_KUBECONFIG_OUT")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Install Runbook's CRDs before serving.
    #[arg(long, env = "RUNBOOK_SANDBOX_CRDS")]
    pub crds: bool,
}

pub async fn run(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let sandbox = Sandbox::default();
    if args.crds {
        let def = sandbox
            .store()
            .def("apiextensions.k8s.io", "customresourcedefinitions")
            .context("CRDs are served")?;
        for crd in runbook_core::crd::all() {
            let v = serde_json::to_value(&crd)?;
            sandbox
                .store()
                .create(&def, "", v, &Default::default())
                .map_err(|e| {
                    anyhow::anyhow!(
                        "installing {}: {}",
                        crd.metadata.name.unwrap_or_default(),
                        e.message
                    )
                })?;
        }
    }
    // The sandbox runs no controllers; the scenarios' world plays the
    // Deployment controller (each new pod template a new ReplicaSet
    // revision, rolled out at once), so `kubectl rollout status|history|undo`
    // work against it.
    let world = runbook_simulator::world::World::new(
        sandbox.clone(),
        "default",
        std::sync::Arc::new(runbook_operator::telemetry::journal::MemoryJournal::default()),
    );
    let controllers = world.spawn(Vec::new());
    let served = sandbox
        .serve(args.port)
        .await
        .context("binding 127.0.0.1")?;
    println!("sandbox serving at http://{}", served.addr);
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, served.kubeconfig("default"))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("kubeconfig written to {}", path.display());
    }
    super::shutdown_signal().await;
    println!("stopping");
    controllers.iter().for_each(|t| t.abort());
    served.stop().await;
    Ok(ExitCode::SUCCESS)
}
