//! Keeps the manual's promises about the code true: its code map (`docs/src/development.md`)
//! names every module, and the README lists every chapter of the manual. Test-only, like
//! `layers.rs` and `limits.rs`.

use std::path::Path;

/// The manual's chapters, from its table of contents (`docs/src/SUMMARY.md`): each file a
/// `(name.md)` link names.
fn chapters(summary: &str) -> Vec<String> {
    summary
        .lines()
        .filter_map(|l| {
            let start = l.find("](")? + 2;
            let end = start + l[start..].find(')')?;
            let file = &l[start..end];
            (file.ends_with(".md") && file != "README.md").then(|| file.to_owned())
        })
        .collect()
}

/// The README names every chapter of the manual (as `docs/src/<chapter>.md`), so a reader who
/// starts there finds each one.
#[test]
fn the_readme_lists_every_chapter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let summary = std::fs::read_to_string(root.join("docs/src/SUMMARY.md")).expect("SUMMARY.md");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let all = chapters(&summary);
    assert!(all.len() > 10, "chapters read from SUMMARY.md: {all:?}");
    let missing: Vec<&String> = all
        .iter()
        .filter(|c| !readme.contains(&format!("docs/src/{c}")))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not list the chapter(s) {missing:?}: add each to its table of the manual"
    );
}

/// The manual's code map (`docs/src/development.md`) names every folder under `src` and every
/// file at its top, so a module cannot be added, moved or renamed without the map following.
#[test]
fn the_code_map_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let map = std::fs::read_to_string(root.join("../docs/src/development.md"))
        .expect("docs/src/development.md");
    let mut missing = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable src") {
            let path = entry.expect("directory entry").path();
            let rel = path.strip_prefix(&src).expect("under src");
            let rel = rel.to_string_lossy();
            let top = !rel.contains('/');
            let name = match (path.is_dir(), top) {
                (true, true) => format!("src/{rel}/"),
                (true, false) => format!("{rel}/"),
                (false, true) if rel.ends_with(".rs") => format!("src/{rel}"),
                (false, _) => continue,
            };
            if path.is_dir() {
                dirs.push(path.clone());
            }
            if !map.contains(&name) {
                missing.push(name);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/src/development.md does not name: {} (add each to the code map and the tree)",
        missing.join(", ")
    );
}
