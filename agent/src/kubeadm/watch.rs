//! The daemon's part: when the configuration or the cluster file in Argus changes, render the
//! ClusterConfiguration and a kube-vip manifest preview into `output_dir` again (never into
//! `/etc/kubernetes`: ginx does not touch the running cluster by itself), and, when the API is
//! reachable, report how the rendered ClusterConfiguration differs from the cluster's
//! `kube-system/kubeadm-config`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;
use tokio::sync::watch;

use super::{facts, render};
use crate::config::Config;
use crate::k8s::{self, KubeClients};
use crate::status::KubeadmStatus;
use crate::types::{Revision, SourceReports};
use crate::util;

/// How often the cluster's kubeadm-config is compared again when nothing changed here.
const DRIFT_INTERVAL: Duration = Duration::from_secs(600);

/// Reads `path` of source `name` at `revision`, blocking; the error says why, without the path.
pub type ReadFile = Arc<dyn Fn(&str, &Revision, &Path) -> Result<Vec<u8>, String> + Send + Sync>;

pub struct Watcher {
    pub config: watch::Receiver<Arc<Config>>,
    pub sources: watch::Receiver<SourceReports>,
    /// Reads a file of a source at a revision; the daemon hands in the sources' workspace.
    pub read_file: ReadFile,
    pub kube: watch::Receiver<Option<KubeClients>>,
    pub status: watch::Sender<Option<KubeadmStatus>>,
    pub shutdown: watch::Receiver<bool>,
}

/// Whether `cfg` says anything about kubeadm at all.
fn configured(cfg: &Config) -> bool {
    cfg.kubeadm.source.is_some() || cfg.kubeadm.facts() != crate::config::ClusterFacts::default()
}

impl Watcher {
    /// The fetched revision of the source the cluster facts come from (`kubeadm.source`).
    fn facts_revision(&self, cfg: &Config) -> Option<Revision> {
        let source = cfg.kubeadm.source.as_ref()?;
        self.sources
            .borrow()
            .get(source)
            .and_then(|s| s.revision.clone())
    }

    pub async fn run(mut self) {
        loop {
            let cfg = Arc::clone(&self.config.borrow());
            let revision = self.facts_revision(&cfg);
            let cluster = self.render(&cfg).await;
            if let Some(c) = cluster {
                self.compare(&c).await;
            }
            let mut tick = Box::pin(tokio::time::sleep(DRIFT_INTERVAL));
            loop {
                tokio::select! {
                    () = &mut tick => break,
                    r = self.config.changed() => { if r.is_err() { return; } break; }
                    r = self.kube.changed() => { if r.is_err() { return; } break; }
                    r = self.sources.changed() => {
                        if r.is_err() { return; }
                        // Only a new revision of the facts' source matters.
                        let cfg = Arc::clone(&self.config.borrow());
                        if self.facts_revision(&cfg) != revision {
                            break;
                        }
                    }
                    _ = self.shutdown.changed() => return,
                }
            }
        }
    }

    /// Renders the files; `None` when kubeadm is not configured or the facts do not resolve.
    async fn render(&self, cfg: &Config) -> Option<facts::Cluster> {
        if !configured(cfg) {
            self.status.send_if_modified(|s| s.take().is_some());
            return None;
        }
        let mut st = KubeadmStatus::default();
        let from_source = match self.source_facts(cfg).await {
            Ok(f) => f,
            Err(e) => {
                st.error = Some(e);
                self.publish(st);
                return None;
            }
        };
        st.facts_from = from_source.as_ref().map(|(origin, _)| origin.clone());
        let merged = super::merged_facts(cfg, from_source.map(|(_, f)| f));
        let mut cluster = match facts::resolve(&merged) {
            Ok(c) => c,
            Err(e) => {
                st.error = Some(e);
                self.publish(st);
                return None;
            }
        };
        let (node, mut warnings) = super::node_facts(cfg);
        if let Err(e) = facts::check_node(&cluster, &node) {
            st.error = Some(e);
            self.publish(st);
            return None;
        }
        warnings.extend(super::complete_interface(&mut cluster, &node));
        let live = &cluster.kube_vip.manifest_path;
        if std::fs::read_to_string(live).is_ok_and(|t| t.contains(render::SUPER_ADMIN_CONF)) {
            warnings.push(format!(
                "{} still mounts {} (it bypasses RBAC); run `ginxctl kubeadm switch-kube-vip` once the API answers",
                live.display(),
                render::SUPER_ADMIN_CONF
            ));
        }
        st.warnings = warnings;
        let out = &cfg.kubeadm.output_dir;
        let files = [
            ("cluster.yaml", render::cluster_configuration(&cluster)),
            (
                "kube-vip.yaml",
                render::kube_vip(&cluster, render::ADMIN_CONF),
            ),
        ];
        for (name, doc) in files {
            let path = out.join(name);
            let text = match render::to_yaml(&[doc]) {
                Ok(t) => t,
                Err(e) => {
                    st.error = Some(e);
                    break;
                }
            };
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str())
                && let Err(e) = super::write_file(&path, &text, false)
            {
                st.error = Some(format!("cannot write {}: {e}", path.display()));
                break;
            }
            st.rendered.push(path);
        }
        if st.error.is_none() {
            st.rendered_at = Some(util::now());
            tracing::info!(files = ?st.rendered, "kubeadm files rendered");
        }
        let previous = self.status.borrow().clone();
        if let Some(p) = previous {
            st.drift = p.drift;
            st.drift_checked_at = p.drift_checked_at;
            st.drift_error = p.drift_error;
        }
        self.publish(st);
        Some(cluster)
    }

    fn publish(&self, st: KubeadmStatus) {
        if let Some(e) = &st.error
            && self.status.borrow().as_ref().and_then(|s| s.error.as_ref()) != Some(e)
        {
            tracing::warn!(error = %e, "cannot render the kubeadm files");
        }
        let next = Some(st);
        self.status.send_if_modified(|s| {
            let changed = *s != next;
            *s = next;
            changed
        });
    }

    async fn source_facts(
        &self,
        cfg: &Config,
    ) -> Result<Option<(String, crate::config::ClusterFacts)>, String> {
        let (Some(source), Some(file)) = (&cfg.kubeadm.source, &cfg.kubeadm.cluster_file) else {
            return Ok(None);
        };
        let revision = self
            .facts_revision(cfg)
            .ok_or_else(|| format!("waiting for the first fetch of {source} (kubeadm.source)"))?;
        let origin = format!("{source}:{}@{}", file.display(), revision.short());
        let read_file = Arc::clone(&self.read_file);
        let (s, f, r) = (source.clone(), file.clone(), revision.clone());
        let bytes = tokio::task::spawn_blocking(move || read_file(&s, &r, &f))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{origin}: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("{origin}: not UTF-8 text"))?;
        super::parse_cluster_file(&origin, &text)
            .map(|f| Some((origin, f)))
            .map_err(String::from)
    }

    /// Compares with the cluster's kubeadm-config when the API is reachable.
    async fn compare(&self, cluster: &facts::Cluster) {
        let Some(clients) = self.kube.borrow().clone() else {
            return;
        };
        let cms: kube::Api<ConfigMap> = kube::Api::namespaced(clients.main, "kube-system");
        let result = match cms.get_opt("kubeadm-config").await {
            Ok(Some(cm)) => match cm.data.and_then(|mut d| d.remove("ClusterConfiguration")) {
                Some(text) => serde_saphyr::from_str::<Value>(&text)
                    .map(|live| differences(&render::cluster_configuration(cluster), &live))
                    .map_err(|e| format!("kube-system/kubeadm-config does not parse: {e}")),
                None => Err("kube-system/kubeadm-config has no ClusterConfiguration".to_owned()),
            },
            Ok(None) => Err(
                "the cluster has no kube-system/kubeadm-config (not set up with kubeadm yet?)"
                    .to_owned(),
            ),
            Err(e) => Err(format!(
                "cannot read kube-system/kubeadm-config: {} (see packaging/kubernetes/rbac.yaml)",
                k8s::describe(&e)
            )),
        };
        let now = util::now();
        self.status.send_if_modified(|s| {
            let Some(s) = s.as_mut() else { return false };
            let before = (s.drift.clone(), s.drift_error.clone());
            match result {
                Ok(d) => {
                    if !d.is_empty() && d != s.drift {
                        tracing::warn!(drift = ?d, "the cluster's kubeadm-config differs from the rendered ClusterConfiguration");
                    }
                    s.drift = d;
                    s.drift_error = None;
                }
                Err(e) => s.drift_error = Some(e),
            }
            s.drift_checked_at = Some(now);
            (s.drift.clone(), s.drift_error.clone()) != before
        });
    }
}

/// The facts ginx renders that differ in `live`, one line each. Defaults kubeadm fills in are
/// applied to both sides, lists compared as sets.
pub fn differences(rendered: &Value, live: &Value) -> Vec<String> {
    let defaults: [(&str, Value); 8] = [
        ("/clusterName", Value::from("kubernetes")),
        ("/kubernetesVersion", Value::Null),
        ("/controlPlaneEndpoint", Value::Null),
        ("/networking/podSubnet", Value::Null),
        ("/networking/serviceSubnet", Value::from("10.96.0.0/12")),
        ("/networking/dnsDomain", Value::from("cluster.local")),
        ("/apiServer/certSANs", Value::Array(Vec::new())),
        ("/proxy/disabled", Value::Bool(false)),
    ];
    let mut out = Vec::new();
    for (path, default) in defaults {
        let get = |v: &Value| v.pointer(path).cloned().unwrap_or_else(|| default.clone());
        let (mut a, mut b) = (get(rendered), get(live));
        for v in [&mut a, &mut b] {
            if let Value::Array(items) = v {
                items.sort_by_key(|x| x.to_string());
            }
        }
        if a != b {
            let show = |v: &Value| match v {
                Value::String(s) => s.clone(),
                Value::Null => "(unset)".to_owned(),
                other => other.to_string(),
            };
            let key = path.trim_start_matches('/').replace('/', ".");
            out.push(format!(
                "{key}: rendered {}, cluster has {}",
                show(&a),
                show(&b)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_apply_kubeadm_defaults_and_ignore_order() {
        let rendered = json!({"clusterName": "kubernetes", "kubernetesVersion": "v1.33.4",
            "controlPlaneEndpoint": "10.0.0.100:6443",
            "networking": {"podSubnet": "10.244.0.0/16", "serviceSubnet": "10.96.0.0/12", "dnsDomain": "cluster.local"},
            "apiServer": {"certSANs": ["10.0.0.100", "k.example.com"]}, "proxy": {"disabled": true}});
        let live = json!({"kubernetesVersion": "v1.33.4", "controlPlaneEndpoint": "10.0.0.100:6443",
            "networking": {"podSubnet": "10.244.0.0/16"},
            "apiServer": {"certSANs": ["k.example.com", "10.0.0.100"]}, "proxy": {"disabled": true}, "etcd": {}});
        assert!(differences(&rendered, &live).is_empty());
        let mut moved = live.clone();
        moved["networking"]["podSubnet"] = json!("10.245.0.0/16");
        moved["proxy"] = json!({});
        assert_eq!(
            differences(&rendered, &moved),
            [
                "networking.podSubnet: rendered 10.244.0.0/16, cluster has 10.245.0.0/16",
                "proxy.disabled: rendered true, cluster has false"
            ]
        );
    }
}
