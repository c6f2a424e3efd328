//! Manifests: multi-document YAML into objects, the order kubectl applies them in, their
//! checksum, and whether Flux owns an object. Pure.

use kube::api::DynamicObject;
use sha2::{Digest, Sha256};

/// Labels a Flux controller puts on what it applies: such an object is Flux's.
pub const FLUX_OWNER_LABELS: &[&str] = &[
    "kustomize.toolkit.fluxcd.io/name",
    "helm.toolkit.fluxcd.io/name",
    "fluxcd.controlplane.io/name",
];

/// The objects in `text` (YAML, `---`-separated; empty documents skipped). `origin` names the
/// file in messages.
pub fn parse(text: &str, origin: &str) -> Result<Vec<DynamicObject>, String> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(text)
        .map_err(|e| format!("{origin}: not valid YAML: {e}"))?;
    let mut out = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        if d.is_null() {
            continue;
        }
        let where_ = format!("{origin}: document {}", i + 1);
        for key in ["apiVersion", "kind"] {
            if !d.get(key).is_some_and(serde_json::Value::is_string) {
                return Err(format!("{where_}: no {key}"));
            }
        }
        if d["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
            return Err(format!(
                "{where_}: a List; write its items as documents of their own"
            ));
        }
        if !d["metadata"]["name"].is_string() {
            return Err(format!(
                "{where_}: no metadata.name (generateName is not applied)"
            ));
        }
        let o: DynamicObject = serde_json::from_value(d).map_err(|e| format!("{where_}: {e}"))?;
        out.push(o);
    }
    Ok(out)
}

pub fn kind(o: &DynamicObject) -> &str {
    o.types.as_ref().map_or("", |t| t.kind.as_str())
}

pub fn is_crd(o: &DynamicObject) -> bool {
    kind(o) == "CustomResourceDefinition"
        && o.types
            .as_ref()
            .is_some_and(|t| t.api_version.starts_with("apiextensions.k8s.io/"))
}

/// `Kind ns/name` (or `Kind name`).
pub fn describe(o: &DynamicObject) -> String {
    let name = o.metadata.name.as_deref().unwrap_or("");
    match &o.metadata.namespace {
        Some(ns) => format!("{} {ns}/{name}", kind(o)),
        None => format!("{} {name}", kind(o)),
    }
}

/// Namespaces and CRDs first (in file order), then the rest (in file order), as kubectl does.
pub fn order(objects: &[DynamicObject]) -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    objects
        .iter()
        .cloned()
        .partition(|o| kind(o) == "Namespace" || is_crd(o))
}

/// The SHA-256 of a stage's manifests, hex.
pub fn checksum(text: &str) -> String {
    let d = Sha256::digest(text.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Flux controller label on `o`, if Flux owns it.
pub fn flux_owner(o: &DynamicObject) -> Option<String> {
    let labels = o.metadata.labels.as_ref()?;
    FLUX_OWNER_LABELS
        .iter()
        .find_map(|l| labels.get(*l).map(|v| format!("{l}={v}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: cilium, namespace: kube-system}
---
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: ciliumnodes.cilium.io}
---
apiVersion: v1
kind: Namespace
metadata:
  name: flux-system
  labels: {kustomize.toolkit.fluxcd.io/name: flux-system}
";

    #[test]
    fn documents_parse_in_order_and_namespaces_and_crds_go_first() {
        let o = parse(TEXT, "t.yaml").unwrap();
        assert_eq!(o.len(), 3);
        let (first, rest) = order(&o);
        assert_eq!(
            first.iter().map(describe).collect::<Vec<_>>(),
            [
                "CustomResourceDefinition ciliumnodes.cilium.io",
                "Namespace flux-system"
            ]
        );
        assert_eq!(
            rest.iter().map(describe).collect::<Vec<_>>(),
            ["DaemonSet kube-system/cilium"]
        );
        assert_eq!(
            flux_owner(&o[2]).as_deref(),
            Some("kustomize.toolkit.fluxcd.io/name=flux-system")
        );
        assert_eq!(flux_owner(&o[0]), None);
    }

    #[test]
    fn bad_documents_are_named() {
        let e = parse("kind: X\nmetadata: {name: a}\n", "s.yaml").unwrap_err();
        assert!(e.contains("s.yaml: document 1: no apiVersion"), "{e}");
        let e = parse("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "s.yaml").unwrap_err();
        assert!(e.contains("no metadata.name"), "{e}");
        let e = parse("a: [\n", "s.yaml").unwrap_err();
        assert!(e.starts_with("s.yaml: not valid YAML"), "{e}");
    }

    #[test]
    fn the_checksum_follows_the_text() {
        assert_eq!(checksum("a"), checksum("a"));
        assert_ne!(checksum("a"), checksum("b"));
        assert_eq!(checksum("").len(), 64);
    }
}
