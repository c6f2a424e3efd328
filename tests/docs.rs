//! The manual: README stays a short first read that points into `docs/`, an
//! mdBook; every page is in its SUMMARY and every link between pages resolves; `mdbook build`
//! builds it (in CI, where mdbook is installed by .ci/run); no page holds rustdoc's link syntax
//! (the reference is made from doc comments, which are written for rustdoc too). The
//! configuration reference's freshness is checked where it is generated (`config::reference`).

use std::process::Command;

use crate::packaging::repo;
use crate::support;

/// Relative links `](x.md…)` of a Markdown text, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with('#') && !target.is_empty() {
                out.push(target.split('#').next().unwrap().to_owned());
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn readme_is_short_and_every_page_of_the_manual_is_linked_and_resolves() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "README.md has {lines} lines; the manual is docs/"
    );
    for l in links(&readme) {
        assert!(
            root.join(&l).exists(),
            "README links to {l}, which is not there"
        );
    }
    let src = root.join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed = links(&summary);
    let mut pages: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    pages.sort();
    for p in &pages {
        assert!(listed.contains(p), "docs/src/{p} is not in SUMMARY.md");
    }
    for l in &listed {
        assert!(
            src.join(l).exists(),
            "SUMMARY.md lists {l}, which is not there"
        );
    }
    for p in &pages {
        let text = std::fs::read_to_string(src.join(p)).unwrap();
        for l in links(&text) {
            assert!(
                src.join(&l).exists() || root.join(&l).exists(),
                "docs/src/{p} links to {l}, which is not there"
            );
        }
    }
}

/// The `[`…`]` of a Markdown text, outside code blocks, that no `(` follows: rustdoc's
/// intra-doc links, which Markdown shows as they are written, brackets and all.
fn leftover_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("[`") {
            rest = &rest[at..];
            let Some(close) = rest.find("`]") else {
                break;
            };
            let end = close + 2;
            if !rest[end..].starts_with('(') {
                out.push(rest[..end].to_owned());
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn leftover_link_syntax_is_told_from_links() {
    assert_eq!(
        leftover_links("default [`DEFAULT_EVENTS`].\nsee [`ginxctl`](ginxctl.md) and `x[0]`"),
        ["[`DEFAULT_EVENTS`]"]
    );
    assert!(leftover_links("```rust\n/// [`load`]\n```\n").is_empty());
}

#[test]
fn no_page_of_the_manual_holds_rustdoc_link_syntax() {
    let root = repo();
    let src = root.join("docs/src");
    let mut pages: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| src.join(n))
        .collect();
    pages.push(root.join("README.md"));
    let mut found = Vec::new();
    for p in &pages {
        let text = std::fs::read_to_string(p).unwrap();
        for l in leftover_links(&text) {
            found.push(format!("{}: {l}", p.strip_prefix(&root).unwrap().display()));
        }
    }
    assert!(
        found.is_empty(),
        "rustdoc links in the manual, shown to readers as written (write the words, or a link with its target; \
         docs/src/reference.md comes from the doc comments in agent/src/config): {found:#?}"
    );
}

#[test]
fn the_manual_builds_with_mdbook() {
    if !support::require("mdbook") {
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("mdbook")
        .arg("build")
        .arg(repo().join("docs"))
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mdbook build docs: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "index.html",
        "reference.html",
        "monitoring.html",
        "figures.html",
    ] {
        assert!(out_dir.path().join(page).exists(), "{page} was not built");
    }
    let index = std::fs::read_to_string(out_dir.path().join("index.html")).unwrap();
    assert!(
        index.contains("keeps NixOS Kubernetes nodes in step with Git"),
        "the front page includes README's opening"
    );
}
