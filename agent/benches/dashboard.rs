//! The Grafana dashboard's picture: `cargo bench --bench dashboard` runs a small
//! fleet against the real control plane, has a real Prometheus (Debian's `prometheus`) scrape
//! every node's `/metrics` each second, then asks Prometheus every query of
//! `packaging/grafana/ginx.json` over the run (`query_range`, Grafana's variables given values)
//! and draws each panel where the dashboard puts it: `docs/src/dashboard.svg`. It is the
//! dashboard's own queries over data from a real run, drawn without Grafana (which this machine
//! has not): lines for time series, bars and numbers for the rest, each series named by its
//! panel's legend format.
//!
//! The run: `BENCH_NODES` (default 4) workers in one group with `max_concurrent = 2`, each
//! stand-in activation taking 3 s and the gate 2 s; four revisions rolled through, the third
//! breaking its first node's gate (rolled back and halted there, so no other node applies it),
//! the fourth mending it. Reboots are not part of it: their panels stay empty.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::control_plane::{self, ControlPlane};
use support::daemon::Daemon;
use support::kubelet::Kubelet;
use support::{Env, wait_for};

const GROUP: &str = "dash";

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_owned()))
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A worker fetching from `origin`, its gate failing while it runs the revision in `bad`.
fn node(cp: &ControlPlane, origin: &Path, name: &str, bad: &Path) -> Env {
    let env = Env::new();
    env.dropin(
        "10-node.toml",
        &format!("[node]\nname = \"{name}\"\nrole = \"worker\"\n"),
    );
    env.dropin(
        "20-remote.toml",
        &format!("[sources.hephaestus]\nurl = \"{}\"\n", origin.display()),
    );
    let kc = env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kc, name);
    let nix = env.fake_nix();
    let current = nix.join("run/current-system/revision");
    env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{kc}\"\nrenew_interval = \"1s\"\n\n\
             [health.kubelet]\nenabled = false\n[health.apiserver]\nenabled = false\n\
             [health.cilium]\nenabled = false\n[health.systemd]\nenabled = false\n\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [system]\nrollback_command = [\"true\"]\n\
             switch_command = [\"sh\", \"-c\", \"echo previous > {c}\"]\n\n\
             [rollout]\nlock = \"kubernetes\"\ngroup = \"{GROUP}\"\nmax_concurrent = 2\n\n\
             [rollout.gate]\nsettle = \"2s\"\ntimeout = \"6s\"\ninterval = \"200ms\"\n\
             command = [\"sh\", \"-c\", \"test \\\"$(cat {c} 2>/dev/null)\\\" != \\\"$(cat {b} 2>/dev/null)\\\"\"]\n",
            kc = kc.display(),
            c = current.display(),
            b = bad.display()
        ),
    );
    env.stub("sleep", "3");
    env
}

fn prometheus(targets: &[String], dir: &Path) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: ginx\n    static_configs:\n      - targets: [{}]\n",
            targets
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus (Debian's package) runs");
    wait_for("prometheus ready", || get(&addr, "/-/ready").map(|_| ()));
    (child, addr)
}

/// One drawn series: its legend and its points (seconds since the start, value).
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn legend(format: &str, metric: &Value) -> String {
    let mut out = format.to_owned();
    while let Some(a) = out.find("{{") {
        let Some(b) = out[a..].find("}}") else { break };
        let label = out[a + 2..a + b].trim().to_owned();
        let value = metric[&label].as_str().unwrap_or("").to_owned();
        let value: String = if label == "revision" {
            value.chars().take(7).collect()
        } else {
            value
        };
        out.replace_range(a..a + b + 2, &value);
    }
    if out.is_empty() {
        metric["node"].as_str().unwrap_or("value").to_owned()
    } else {
        out
    }
}

fn query(prom: &str, expr: &str, start: f64, end: f64, format: &str) -> Vec<Series> {
    let path = format!(
        "/api/v1/query_range?query={}&start={start}&end={end}&step=2",
        encode(expr)
    );
    let Some(body) = get(prom, &path) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Series {
            name: legend(format, &r["metric"]),
            points: r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let t = p[0].as_f64()?;
                    let y: f64 = p[1].as_str()?.parse().ok()?;
                    y.is_finite().then_some((t - start, y))
                })
                .collect(),
        })
        .collect()
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Draws `series` as `kind` in the box (x, y, w, h).
fn panel(svg: &mut String, kind: &str, title: &str, series: &[Series], b: (f64, f64, f64, f64)) {
    let (x, y, w, h) = b;
    let _ = write!(
        svg,
        "<rect x='{x}' y='{y}' width='{w}' height='{h}' fill='#ffffff' stroke='#cccccc'/>\
         <text x='{}' y='{}' font-size='13' font-weight='bold'>{}</text>",
        x + 8.0,
        y + 18.0,
        esc(title)
    );
    let (px, py, pw, ph) = (x + 40.0, y + 28.0, w - 56.0, h - 60.0);
    if series.iter().all(|s| s.points.is_empty()) {
        let _ = write!(
            svg,
            "<text x='{}' y='{}' font-size='12' fill='#999999'>no data in this run</text>",
            px,
            py + ph / 2.0
        );
        return;
    }
    if kind != "timeseries" {
        // The value at the end of the run of each series still there then, as a bar
        // (bargauge) or a number (stat, table), as Grafana shows its "last" value.
        let t_end = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold(0.0_f64, f64::max);
        let last: Vec<(&str, f64)> = series
            .iter()
            .filter_map(|s| {
                s.points
                    .last()
                    .filter(|p| p.0 >= t_end - 4.0)
                    .map(|p| (s.name.as_str(), p.1))
            })
            .collect();
        let most = last.iter().map(|l| l.1).fold(1.0_f64, f64::max);
        let row = (ph / last.len().max(1) as f64).min(22.0);
        for (i, (name, v)) in last.iter().enumerate() {
            let ry = py + i as f64 * row;
            if kind == "bargauge" {
                let bw = (pw - 120.0) * v / most;
                let _ = write!(
                    svg,
                    "<rect x='{}' y='{}' width='{bw:.1}' height='{:.1}' fill='{}'/>",
                    x + 130.0,
                    ry + 2.0,
                    row - 4.0,
                    COLORS[i % COLORS.len()]
                );
            }
            let _ = write!(
                svg,
                "<text x='{}' y='{:.1}' font-size='11'>{}</text>\
                 <text x='{}' y='{:.1}' font-size='11' text-anchor='end'>{v}</text>",
                x + 8.0,
                ry + row - 7.0,
                esc(name),
                x + w - 8.0,
                ry + row - 7.0
            );
        }
        return;
    }
    let t_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let _ = write!(
        svg,
        "<line x1='{px}' y1='{}' x2='{}' y2='{}' stroke='#999999'/>\
         <text x='{}' y='{}' font-size='10' text-anchor='end'>{}</text>\
         <text x='{}' y='{}' font-size='10' text-anchor='end'>0</text>\
         <text x='{}' y='{}' font-size='10' text-anchor='end'>{:.0} s</text>",
        py + ph,
        px + pw,
        py + ph,
        px - 4.0,
        py + 8.0,
        round(y_max),
        px - 4.0,
        py + ph,
        px + pw,
        py + ph + 12.0,
        t_max
    );
    // Series that stayed 0 all along are left out (Grafana's "hide series with only zeros").
    let shown: Vec<&Series> = series
        .iter()
        .filter(|s| s.points.iter().any(|p| p.1 != 0.0))
        .take(COLORS.len())
        .collect();
    for (i, s) in shown.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", px + pw * t / t_max, py + ph - ph * v / y_max))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill='none' stroke='{c}' stroke-width='1.5' points='{}'/>\
             <text x='{}' y='{}' font-size='10' fill='{c}'>{}</text>",
            pts.join(" "),
            px + 4.0 + (i % 4) as f64 * (pw / 4.0),
            y + h - 6.0 - (1 - i / 4) as f64 * 11.0 * f64::from(u8::from(shown.len() > 4)),
            esc(&s.name.chars().take(28).collect::<String>()),
            c = COLORS[i]
        );
    }
}

fn round(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn main() {
    let Some(bin) = control_plane::require() else {
        println!("dashboard bench skipped: no control-plane binary");
        return;
    };
    if !support::require("prometheus") {
        return;
    }
    let nodes = std::env::var("BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4usize);
    let cp = ControlPlane::start(&bin);
    let origin = Env::new();
    let bad = origin.root.join("bad-revision");
    let names: Vec<String> = (1..=nodes).map(|i| format!("dash-{i}")).collect();
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(&cp, n, "worker"))
        .collect();
    let envs: Vec<Env> = names
        .iter()
        .map(|n| node(&cp, &origin.repo.path, n, &bad))
        .collect();
    let daemons: Vec<Daemon> = envs.iter().map(Env::start).collect();
    let targets: Vec<String> = daemons
        .iter()
        .map(|d| {
            d.wait_status("metrics", |s| s["metrics_listen"].is_string())["metrics_listen"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (mut prom, prom_addr) = prometheus(&targets, dir.path());
    let start = jiff::Timestamp::now().as_second() as f64;
    let t0 = Instant::now();

    let sync_all = || {
        for d in &daemons {
            d.ctl_ok(&["sync"]);
        }
    };
    let first = origin.repo.head();
    sync_all();
    for d in &daemons {
        d.wait_applied(&first);
    }
    let r2 = origin.repo.commit("hive.nix", "{ r = 2; }", "r2");
    sync_all();
    for d in &daemons {
        d.wait_applied(&r2);
    }
    // r3 breaks the first node to take it: only one of the two slots' holders applies it.
    let r3 = origin.repo.commit("hive.nix", "{ r = 3; }", "r3");
    std::fs::write(&bad, format!("{r3}\n")).unwrap();
    sync_all();
    wait_for("r3 halted", || {
        daemons
            .iter()
            .any(|d| d.status()["rollout"]["halt"]["revision"] == r3.as_str())
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(8));
    let r4 = origin.repo.commit("hive.nix", "{ r = 4; }", "r4");
    sync_all();
    for d in &daemons {
        d.wait_applied(&r4);
    }
    std::thread::sleep(Duration::from_secs(10));
    let end = jiff::Timestamp::now().as_second() as f64;
    println!(
        "dashboard bench: {} nodes, 4 revisions (r3 halted), {:.0} s, Prometheus scraping each second",
        nodes,
        t0.elapsed().as_secs_f64()
    );

    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("packaging/grafana/ginx.json")).unwrap(),
    )
    .unwrap();
    let (unit_w, unit_h) = (50.0, 28.0);
    let panels = dash["panels"].as_array().unwrap();
    let height = panels
        .iter()
        .map(|p| p["gridPos"]["y"].as_f64().unwrap() + p["gridPos"]["h"].as_f64().unwrap())
        .fold(0.0, f64::max)
        * unit_h;
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif'>\
         <rect width='{w}' height='{h}' fill='#f4f5f5'/>",
        w = 24.0 * unit_w + 8.0,
        h = height + 8.0
    );
    let mut drawn = 0;
    for p in panels {
        let g = &p["gridPos"];
        let bx = (
            4.0 + g["x"].as_f64().unwrap() * unit_w,
            4.0 + g["y"].as_f64().unwrap() * unit_h,
            g["w"].as_f64().unwrap() * unit_w - 4.0,
            g["h"].as_f64().unwrap() * unit_h - 4.0,
        );
        let kind = p["type"].as_str().unwrap_or("");
        let title = p["title"].as_str().unwrap_or("");
        if kind == "row" {
            let _ = write!(
                svg,
                "<text x='{}' y='{}' font-size='15' font-weight='bold'>{}</text>",
                bx.0 + 4.0,
                bx.1 + 18.0,
                esc(title)
            );
            continue;
        }
        let mut series = Vec::new();
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "15s")
                .replace("$group", ".*");
            series.extend(query(
                &prom_addr,
                &expr,
                start,
                end,
                t["legendFormat"].as_str().unwrap_or(""),
            ));
        }
        let points: usize = series.iter().map(|s| s.points.len()).sum();
        println!("| {title} | {} series | {points} points |", series.len());
        if points > 0 {
            drawn += 1;
        }
        panel(&mut svg, kind, title, &series, bx);
    }
    svg.push_str("</svg>\n");
    let out = std::env::var("BENCH_DASHBOARD_SVG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| repo().join("docs/src/dashboard.svg"));
    std::fs::write(&out, svg).unwrap();
    println!(
        "dashboard bench: {drawn} of {} panels with data; drawn to {}",
        panels.iter().filter(|p| p["type"] != "row").count(),
        out.display()
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(prom.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = prom.wait();
    drop(daemons);
}
