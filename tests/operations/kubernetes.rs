//! The Kubernetes manifests (`deploy/kubernetes/`), offline: every resource validated against
//! Kubernetes' own schemas (`kubernetes-validate` from PyPI, installed into
//! `target/k8s-validate/` on first use), the ConfigMap the kustomization generates too; every
//! manifest in the directory listed in the kustomization; the TOML the ConfigMap carries
//! passes `turnstile check` with the Secret's files in place; and the Deployment agrees with
//! the TOML (ports, probes, writable paths, the shutdown budget).

use crate::common::turnstile;
use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const VALIDATOR: &str = "kubernetes-validate==1.37.0";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn yaml(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join(name)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

use serde::Deserialize;

/// The validator's executable, installed into a virtual environment under `target/` once.
fn validator() -> PathBuf {
    crate::common::python::venv("k8s-validate", &[VALIDATOR]).join("kubernetes-validate")
}

fn validate(exe: &Path, file: &Path) {
    let out = Command::new(exe)
        .args(["--strict", "--quiet"])
        .arg(file)
        .output()
        .expect("run kubernetes-validate");
    assert!(
        out.status.success(),
        "{}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_manifest_passes_kubernetes_schemas_and_the_kustomization_lists_them() {
    let kustomization = &yaml("kustomization.yaml")[0];
    let resources: Vec<String> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed = resources.clone();
    listed.sort();
    assert_eq!(listed, on_disk, "every manifest is in the kustomization");
    let exe = validator();
    for file in &resources {
        validate(&exe, &dir().join(file));
    }
    // The ConfigMap the generator makes from the TOML file.
    let generated = &kustomization["configMapGenerator"][0];
    let name = generated["name"].as_str().unwrap();
    let file = generated["files"][0].as_str().unwrap();
    let text = std::fs::read_to_string(dir().join(file)).unwrap();
    let mut data = serde_yaml::Mapping::new();
    data.insert(file.into(), text.into());
    let config_map: Value = serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
    ))
    .unwrap();
    let mut config_map = config_map.as_mapping().unwrap().clone();
    config_map.insert("data".into(), Value::Mapping(data));
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("configmap.yaml");
    std::fs::write(&path, serde_yaml::to_string(&config_map).unwrap()).unwrap();
    validate(&exe, &path);
}

#[test]
fn the_configmaps_toml_passes_check_with_the_secrets_files_in_place() {
    let secret = &yaml("secret.yaml")[0];
    let tmp = tempfile::tempdir().unwrap();
    for (name, value) in secret["stringData"].as_mapping().unwrap() {
        std::fs::write(
            tmp.path().join(name.as_str().unwrap()),
            value.as_str().unwrap(),
        )
        .unwrap();
    }
    let text = std::fs::read_to_string(dir().join("turnstile.toml")).unwrap();
    assert!(text.contains("/etc/turnstile/secrets/"));
    let text = text.replace(
        "/etc/turnstile/secrets/",
        &format!("{}/", tmp.path().display()),
    );
    let path = tmp.path().join("turnstile.toml");
    std::fs::write(&path, text).unwrap();
    let (code, out, err) = turnstile(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": ok"), "{out}");
}

#[test]
fn the_deployment_agrees_with_the_gateways_configuration() {
    let deployment = &yaml("deployment.yaml")[0];
    let spec = &deployment["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let toml: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir().join("turnstile.toml")).unwrap()).unwrap();
    let port_of = |listen: &str| listen.rsplit(':').next().unwrap().parse::<u64>().unwrap();
    let ports: Vec<(String, u64)> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(ports.contains(&(
        "http".into(),
        port_of(toml["server"]["listen"].as_str().unwrap())
    )));
    assert!(ports.contains(&(
        "admin".into(),
        port_of(toml["admin"]["listen"].as_str().unwrap())
    )));
    assert!(toml["admin"]["listen"]
        .as_str()
        .unwrap()
        .starts_with("0.0.0.0:"));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(deployment["spec"]["replicas"], 3);
    // What the gateway writes lives on a writable mount.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for key in ["pid_file", "upgrade_sock"] {
        let path = toml["server"][key].as_str().unwrap();
        assert!(
            mounts.iter().any(|m| path.starts_with(&format!("{m}/"))),
            "{key} = {path} on no mount"
        );
    }
    // The config is mounted as a directory (a subPath mount would never see an update).
    assert!(container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .all(|m| m.get("subPath").is_none()));
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["--config", "/etc/turnstile/config/turnstile.toml"]);
    // preStop + grace period + shutdown timeout fit in the pod's termination budget.
    let secs = |key: &str| {
        toml["server"][key]
            .as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse::<u64>()
            .unwrap()
    };
    let pre_stop: u64 = container["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let budget = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        pre_stop + secs("grace_period") + secs("graceful_shutdown_timeout") < budget,
        "the pod is killed before the gateway has shut down"
    );
}
