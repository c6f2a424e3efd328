//! Keeps files small enough to read: no source file has more than [`MAX_FILE_LINES`] lines of
//! non-test code. Test-only, like `layers.rs`, whose scanner it shares; the length of a
//! function is clippy's to check (`clippy::too_many_lines`, threshold in `clippy.toml`).
//!
//! Non-test code is every line (blank and comment lines too) outside items marked `#[cfg(test)]` (a test module, a test
//! helper), in files other than the `*_tests.rs` files such a module may live in.

use std::path::Path;

use crate::layers::{code_only, item_end, rust_files};

/// The most lines of non-test code one source file may have.
const MAX_FILE_LINES: usize = 800;

/// Lines of `text` outside `#[cfg(test)]` items.
fn non_test_lines(text: &str) -> usize {
    // The scanner keeps every newline, so a line of `code` is the same line of `text`.
    let code = code_only(text);
    let line_of = |offset: usize| code[..offset].matches('\n').count();
    let mut test_lines = 0;
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let start = from + at;
        let end = item_end(&code, start);
        test_lines += line_of(end) - line_of(start) + 1;
        from = end;
    }
    text.lines().count().saturating_sub(test_lines)
}

#[test]
fn no_source_file_is_over_eight_hundred_lines_of_non_test_code() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut over: Vec<String> = files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            let n = non_test_lines(&text);
            (n > MAX_FILE_LINES).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    over.sort();
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines of non-test code; split by concern:\n{}",
        over.join("\n")
    );
}

#[test]
fn test_items_do_not_count() {
    let text = "fn a() {\n    1\n}\n\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    assert_eq!(non_test_lines(text), 4);
    let wide = "// é → ü\nfn a() {}\n#[cfg(test)]\nmod tests {}\n";
    assert_eq!(non_test_lines(wide), 2);
    let helper = "#[cfg(test)]\nuse x;\nfn c() {}\n";
    assert_eq!(non_test_lines(helper), 1);
}
