//! The bootstrap of a new cluster after `kubeadm init` (`ginxctl bootstrap`): stages of
//! manifests applied in order, each waited for before the next (the CNI before anything that
//! needs pod networking, the Flux Operator before its FluxInstance).
//!
//! Neither kube-rs nor a maintained crate does `kubectl apply -f` with stages, so this follows
//! these of kubectl's behaviours, and says where it differs:
//! - server-side apply (`kubectl apply --server-side`), field manager `ginx`, **without**
//!   `--force-conflicts`: a field another manager owns is a conflict, reported, not taken;
//! - within a file, Namespaces and CRDs first, as `kubectl apply` sorts them; then the CRDs are
//!   waited for (`Established`) and the API is discovered again for the rest (kubectl fails on
//!   a kind it cannot map and needs a second run);
//! - `--dry-run=server` for `--dry-run`;
//! - never `--prune`, never a delete;
//! - unlike kubectl, an object labelled as owned by a Flux controller is left alone: after the
//!   hand-off Flux owns it.
//!
//! A stage that was applied and whose waits held is recorded with the checksum of its
//! manifests in the ConfigMap `kube-system/ginx-bootstrap`: a rerun applies only the stages
//! that changed (an unchanged rerun writes nothing). One bootstrap runs at a time in the whole
//! cluster: the Lease `ginx-bootstrap` in `ginx-system`.
//!
//! A worker (layer 5): imports `config`, `types`, `util` only.

pub mod flux;
pub mod manifest;
pub mod wait;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};

use crate::config::Wait;
use crate::k8s::{code, describe};

pub use manifest::{FLUX_OWNER_LABELS, checksum, flux_owner, parse};

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = crate::k8s::FIELD_MANAGER;
/// Where the stages' checksums are kept.
pub const RECORD_NAMESPACE: &str = "kube-system";
pub const RECORD_NAME: &str = "ginx-bootstrap";
/// The cluster-wide lock.
pub const LOCK_NAMESPACE: &str = "ginx-system";
pub const LOCK_NAME: &str = "ginx-bootstrap";
/// The lock's duration; renewed while waiting.
const LOCK_SECONDS: i32 = 60;
/// Waits are looked at this often.
const POLL: Duration = Duration::from_secs(1);

/// One stage, ready to run: its manifests' text and checksum.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub name: String,
    /// Where the manifests came from, for messages (`argus:bootstrap/cilium.yaml@abc123`).
    pub origin: String,
    pub text: String,
    pub waits: Vec<Wait>,
    pub timeout: Duration,
}

/// What a run tells its caller as it goes: lines to print, and where it is.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line of progress: a stage starting, an object applied or skipped, a wait that holds.
    Line(&'a str),
    /// A stage starts (applied, or found unchanged).
    Stage(&'a str),
    /// A wait does not hold yet; sent at every look (once a second), `since` the wait began.
    Waiting {
        wait: &'a Wait,
        why: &'a str,
        since: Instant,
    },
    /// A stage's waits are satisfied.
    Satisfied(&'a str),
}

/// How a run ends.
#[derive(Debug)]
pub enum Failure {
    /// Objects not ready, a refused apply, a bad manifest: exit 1.
    Stage(String),
    /// The API cannot be reached: exit 2.
    Api(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::Stage(m) | Failure::Api(m) => m,
        }
    }
}

/// An API error: transport errors and 5xx mean the API is away.
fn api_failure(what: &str, e: &kube::Error) -> Failure {
    let m = format!("{what}: {}", describe(e));
    match code(e) {
        Some(c) if c < 500 => Failure::Stage(m),
        _ => Failure::Api(m),
    }
}

/// Whether `holder` was a run on this node (the node of `ours`) whose process is gone (killed,
/// or the machine rebooted): its Lease is taken over rather than waited out.
fn dead_here(holder: &str, ours: &str) -> bool {
    let split = |h: &str| {
        h.split_once("/ginxctl-")
            .map(|(n, p)| (n.to_owned(), p.parse::<u32>().ok()))
    };
    match (split(holder), split(ours)) {
        (Some((theirs, Some(pid))), Some((node, _))) if theirs == node => {
            !crate::util::process_is(pid, None)
        }
        _ => false,
    }
}

pub struct Bootstrap {
    client: kube::Client,
    dry_run: bool,
    holder: String,
    kinds: BTreeMap<(String, String), (ApiResource, ApiCapabilities)>,
    /// Namespaces applied in a dry run: the server cannot dry-run objects into them.
    dry_namespaces: std::collections::BTreeSet<String>,
}

impl Bootstrap {
    pub fn new(client: kube::Client, dry_run: bool, holder: &str) -> Self {
        Self {
            client,
            dry_run,
            holder: holder.to_owned(),
            kinds: BTreeMap::new(),
            dry_namespaces: Default::default(),
        }
    }

    /// Takes the cluster-wide lock, or says who holds it.
    pub async fn lock(&self) -> Result<(), Failure> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LOCK_NAMESPACE);
        let now = jiff::Timestamp::now();
        let existing = api.get_opt(LOCK_NAME).await.map_err(|e| {
            api_failure(
                &format!("cannot read Lease {LOCK_NAMESPACE}/{LOCK_NAME}"),
                &e,
            )
        })?;
        let spec = |l: &Lease| l.spec.clone().unwrap_or_default();
        if let Some(l) = &existing {
            let s = spec(l);
            let holder = s.holder_identity.clone().unwrap_or_default();
            let renewed = s.renew_time.as_ref().map(|t| t.0);
            let live = renewed.is_some_and(|t| {
                now.duration_since(t).as_secs() < i64::from(s.lease_duration_seconds.unwrap_or(0))
            });
            if live
                && !holder.is_empty()
                && holder != self.holder
                && !dead_here(&holder, &self.holder)
            {
                return Err(Failure::Stage(format!(
                    "another bootstrap runs: Lease {LOCK_NAMESPACE}/{LOCK_NAME} is held by {holder} \
                     (renewed {}); wait for it, or for the Lease to expire ({LOCK_SECONDS}s after it stops)",
                    renewed.map_or_else(|| "-".to_owned(), |t| t.to_string())
                )));
            }
        }
        let mut lease = existing.unwrap_or_else(|| Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(LOCK_NAME.into()),
                namespace: Some(LOCK_NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        let micro = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now);
        let s = lease.spec.get_or_insert_with(Default::default);
        s.holder_identity = Some(self.holder.clone());
        s.lease_duration_seconds = Some(LOCK_SECONDS);
        s.acquire_time = Some(micro.clone());
        s.renew_time = Some(micro);
        let result = if lease.metadata.resource_version.is_some() {
            api.replace(LOCK_NAME, &crate::k8s::post_params(), &lease)
                .await
        } else {
            api.create(&crate::k8s::post_params(), &lease).await
        };
        match result {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some(409) => Err(Failure::Stage(format!(
                "another bootstrap took Lease {LOCK_NAMESPACE}/{LOCK_NAME} just now; try again"
            ))),
            Err(e) => Err(api_failure(
                &format!("cannot take Lease {LOCK_NAMESPACE}/{LOCK_NAME}"),
                &e,
            )),
        }
    }

    /// The holder identity of a run: `<node>/ginxctl-<pid>`, so that two runs on one node are
    /// told apart as well as two nodes.
    pub fn holder(node: &str) -> String {
        format!("{node}/ginxctl-{}", std::process::id())
    }

    /// Renews the lock (while waiting); best effort.
    async fn renew(&self) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LOCK_NAMESPACE);
        if let Ok(Some(mut l)) = api.get_opt(LOCK_NAME).await
            && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&self.holder)
        {
            if let Some(s) = l.spec.as_mut() {
                s.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    jiff::Timestamp::now(),
                ));
            }
            let _ = api.replace(LOCK_NAME, &crate::k8s::post_params(), &l).await;
        }
    }

    /// Gives the lock back.
    pub async fn unlock(&self) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), LOCK_NAMESPACE);
        if let Ok(Some(mut l)) = api.get_opt(LOCK_NAME).await
            && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&self.holder)
        {
            if let Some(s) = l.spec.as_mut() {
                s.holder_identity = None;
            }
            let _ = api.replace(LOCK_NAME, &crate::k8s::post_params(), &l).await;
        }
    }

    /// The checksums of the stages done, by stage name.
    pub async fn recorded(&self) -> Result<BTreeMap<String, String>, Failure> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), RECORD_NAMESPACE);
        match api.get_opt(RECORD_NAME).await {
            Ok(cm) => Ok(cm
                .and_then(|c| c.data)
                .unwrap_or_default()
                .into_iter()
                .collect()),
            Err(e) => Err(api_failure(
                &format!("cannot read ConfigMap {RECORD_NAMESPACE}/{RECORD_NAME}"),
                &e,
            )),
        }
    }

    /// Records `stage` as done with `sum`, beside what `recorded` holds: the whole map is
    /// applied (server-side apply removes the keys a manager stops applying).
    async fn record(
        &self,
        recorded: &BTreeMap<String, String>,
        stage: &str,
        sum: &str,
    ) -> Result<(), Failure> {
        if self.dry_run {
            return Ok(());
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), RECORD_NAMESPACE);
        let mut data = recorded.clone();
        data.insert(stage.to_owned(), sum.to_owned());
        let patch = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": RECORD_NAME, "namespace": RECORD_NAMESPACE},
            "data": data,
        });
        api.patch(
            RECORD_NAME,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            api_failure(
                &format!(
                    "cannot record stage {stage} in ConfigMap {RECORD_NAMESPACE}/{RECORD_NAME}"
                ),
                &e,
            )
        })
    }

    /// The API resource of `obj`'s kind, discovered once per run (again after CRDs).
    async fn kind_of(
        &mut self,
        obj: &DynamicObject,
    ) -> Result<(ApiResource, ApiCapabilities), Failure> {
        let tm = obj.types.clone().unwrap_or_default();
        let key = (tm.api_version.clone(), tm.kind.clone());
        if let Some(k) = self.kinds.get(&key) {
            return Ok(k.clone());
        }
        let (group, version) = match tm.api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), tm.api_version.clone()),
        };
        let gvk = kube::api::GroupVersionKind::gvk(&group, &version, &tm.kind);
        let found = discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| match code(&e) {
                Some(404) | None if matches!(e, kube::Error::Discovery(_)) => {
                    Failure::Stage(format!(
                        "the API has no kind {} in {}: is its CRD in an earlier stage?",
                        tm.kind, tm.api_version
                    ))
                }
                _ => api_failure(
                    &format!("cannot discover {} {}", tm.api_version, tm.kind),
                    &e,
                ),
            })?;
        self.kinds.insert(key, found.clone());
        Ok(found)
    }

    fn api_for(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        ns: Option<&str>,
    ) -> Api<DynamicObject> {
        match (caps.scope.clone(), ns) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, ar),
            (Scope::Namespaced, None) => Api::default_namespaced_with(self.client.clone(), ar),
            (Scope::Cluster, _) => Api::all_with(self.client.clone(), ar),
        }
    }

    /// Applies one object; `Ok(false)` when it was left alone (Flux owns it).
    async fn apply(
        &mut self,
        obj: &DynamicObject,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<bool, Failure> {
        let (ar, caps) = self.kind_of(obj).await?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let ns = obj.metadata.namespace.clone();
        let api = self.api_for(&ar, &caps, ns.as_deref());
        let what = manifest::describe(obj);
        match api.get_opt(&name).await {
            Ok(Some(live)) => {
                if let Some(owner) = flux_owner(&live) {
                    progress(Event::Line(&format!(
                        "  skipped {what}: owned by Flux ({owner})"
                    )));
                    return Ok(false);
                }
            }
            Ok(None) => {}
            Err(e) => return Err(api_failure(&format!("cannot read {what}"), &e)),
        }
        if self.dry_run && ns.as_ref().is_some_and(|n| self.dry_namespaces.contains(n)) {
            // As with kubectl's --dry-run=server, the server cannot check an object in a
            // namespace that only the dry run created.
            progress(Event::Line(&format!(
                "  not checked {what}: its namespace is created by this stage (dry run)"
            )));
            return Ok(true);
        }
        let mut pp = PatchParams::apply(FIELD_MANAGER);
        pp.dry_run = self.dry_run;
        match api.patch(&name, &pp, &Patch::Apply(obj)).await {
            Ok(_) => {
                if self.dry_run && manifest::kind(obj) == "Namespace" {
                    self.dry_namespaces.insert(name.clone());
                }
                progress(Event::Line(&format!(
                    "  applied {what}{}",
                    if self.dry_run { " (dry run)" } else { "" }
                )));
                Ok(true)
            }
            Err(e) if code(&e) == Some(409) => Err(Failure::Stage(format!(
                "{what}: {} — another field manager owns these fields; ginx does not force \
                 (change them there, or give them up to ginx with kubectl apply --server-side \
                 --force-conflicts --field-manager=ginx)",
                describe(&e)
            ))),
            Err(e) => Err(api_failure(&format!("cannot apply {what}"), &e)),
        }
    }

    /// Runs one stage: applies it (unless its checksum is recorded), then waits; `recorded` is
    /// updated with it once its waits hold.
    pub async fn stage(
        &mut self,
        stage: &Prepared,
        recorded: &mut BTreeMap<String, String>,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), Failure> {
        progress(Event::Stage(&stage.name));
        let sum = checksum(&stage.text);
        let objects = parse(&stage.text, &stage.origin)
            .map_err(|e| Failure::Stage(format!("stage {}: {e}", stage.name)))?;
        if recorded.get(&stage.name) == Some(&sum) {
            progress(Event::Line(&format!(
                "stage {}: unchanged since it was applied ({})",
                stage.name,
                &sum[..12]
            )));
        } else {
            progress(Event::Line(&format!(
                "stage {}: applying {} object(s) from {}",
                stage.name,
                objects.len(),
                stage.origin
            )));
            let (first, rest) = manifest::order(&objects);
            let mut crds = Vec::new();
            for o in &first {
                self.apply(o, progress).await?;
                if manifest::is_crd(o) {
                    crds.push(o.metadata.name.clone().unwrap_or_default());
                }
            }
            if !crds.is_empty() && !self.dry_run {
                let deadline = Instant::now() + stage.timeout;
                for c in &crds {
                    self.wait_for(
                        &Wait::Crd { name: c.clone() },
                        deadline,
                        &stage.name,
                        progress,
                    )
                    .await?;
                }
                // New kinds: discover them afresh.
                self.kinds.clear();
            }
            for o in &rest {
                self.apply(o, progress).await?;
            }
        }
        if !self.dry_run {
            let deadline = Instant::now() + stage.timeout;
            for w in &stage.waits {
                self.wait_for(w, deadline, &stage.name, progress).await?;
            }
            if recorded.get(&stage.name) != Some(&sum) {
                self.record(recorded, &stage.name, &sum).await?;
                recorded.insert(stage.name.clone(), sum.clone());
            }
        }
        progress(Event::Satisfied(&stage.name));
        progress(Event::Line(&format!("stage {}: done", stage.name)));
        Ok(())
    }

    async fn wait_for(
        &self,
        w: &Wait,
        deadline: Instant,
        stage: &str,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), Failure> {
        let since = Instant::now();
        let mut renewed = Instant::now();
        loop {
            let why = match wait::check(&self.client, w).await {
                Ok(None) => {
                    progress(Event::Line(&format!("  {w} holds")));
                    return Ok(());
                }
                Ok(Some(why)) => why,
                Err(e) => return Err(e),
            };
            progress(Event::Waiting {
                wait: w,
                why: &why,
                since,
            });
            if Instant::now() >= deadline {
                return Err(Failure::Stage(format!(
                    "stage {stage}: {w} did not hold within the stage's timeout: {why}; fix it, \
                     then run `ginxctl bootstrap` again (done stages are not applied again)"
                )));
            }
            if renewed.elapsed()
                > Duration::from_secs(u64::try_from(LOCK_SECONDS / 3).unwrap_or(20))
            {
                self.renew().await;
                renewed = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dead_here;

    #[test]
    fn only_a_gone_run_of_this_node_loses_its_lease() {
        let me = format!("lucy/ginxctl-{}", std::process::id());
        // pid 1 runs: alive.
        assert!(!dead_here("lucy/ginxctl-1", &me));
        // No such pid (above pid_max).
        assert!(dead_here("lucy/ginxctl-4194305", &me));
        // Another node's run is never judged from here.
        assert!(!dead_here("makise/ginxctl-4194305", &me));
        assert!(!dead_here("an-old-ginx", &me));
    }
}
