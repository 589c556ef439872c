//! Compiles the kubelet gRPC APIs in `proto/` without a system `protoc`:
//! protox parses them into a descriptor set, tonic-prost-build generates
//! messages, clients and servers.
//!
//! Every proto package is compiled in its own invocation into its own
//! directory under `OUT_DIR`: the dra-health packages have bare names (`v1`,
//! `v1alpha1`) that other kubelet APIs reuse (podresources is also `v1`), and
//! generated files are named after the package, so one shared output
//! directory would merge them. `src/grpc.rs` includes each file.

use std::{error::Error, path::PathBuf};

/// (output sub-directory, proto file relative to `proto/`).
const PACKAGES: &[(&str, &str)] = &[
    ("dra_v1", "dra/v1/dra.proto"),
    ("dra_v1beta1", "dra/v1beta1/dra.proto"),
    ("health_v1alpha1", "dra-health/v1alpha1/health.proto"),
    ("health_v1", "dra-health/v1/health.proto"),
    ("registration", "pluginregistration/registration.proto"),
];

fn main() -> Result<(), Box<dyn Error>> {
    // compile_fds emits no rerun-if-changed itself.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for (dir, file) in PACKAGES {
        println!("cargo:rerun-if-changed=proto/{file}");
        let fds = protox::compile([*file], ["proto"])?;
        let out = out_dir.join(dir);
        std::fs::create_dir_all(&out)?;
        tonic_prost_build::configure()
            .build_server(true)
            .build_client(true)
            .build_transport(true)
            // The call recorder stores decoded messages as JSON.
            .type_attribute(".", "#[derive(serde::Serialize)]")
            .out_dir(&out)
            .compile_fds(fds)?;
    }
    Ok(())
}
