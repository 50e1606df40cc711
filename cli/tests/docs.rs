//! docs/ARCHITECTURE.md's "Life of a READ" and "Life of a WRITE" walk through real files,
//! functions and fields: this fails when one they name is gone (renamed, moved, deleted), so
//! the walk cannot drift from the code.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The text of the sections whose heading starts with `## Life of`.
fn life_sections(doc: &str) -> String {
    let mut out = String::new();
    let mut on = false;
    for line in doc.lines() {
        if line.starts_with("## ") {
            on = line.starts_with("## Life of");
        }
        if on {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every `code span` of `text`.
fn spans(text: &str) -> Vec<String> {
    text.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// Every file of the repository below `dir`, outside `target` and dot folders.
fn repo_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            repo_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn the_life_of_a_request_names_files_and_functions_that_exist() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE");
    let life = life_sections(&doc);
    assert!(
        life.contains("## Life of a READ") && life.contains("## Life of a WRITE"),
        "docs/ARCHITECTURE.md lost its Life of a READ / WRITE sections"
    );
    let mut files = Vec::new();
    repo_files(&root, &mut files);
    let code: String = files
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let (mut files, mut fns) = (0, 0);
    let mut missing = Vec::new();
    for s in spans(&life) {
        if s.contains('/') && (s.ends_with(".rs") || s.ends_with('/')) && !s.contains(' ') {
            files += 1;
            if !root.join(&s).exists() {
                missing.push(format!("file {s}"));
            }
        } else if let Some((ty, f)) = s.split_once("::")
            && !ty.is_empty()
            && ty.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && f.starts_with(|c: char| c.is_ascii_lowercase())
        {
            fns += 1;
            // A function, or a field (`ServerConfig::max_in_flight`).
            let found = [format!("fn {f}("), format!("fn {f}<"), format!(" {f}: ")]
                .iter()
                .any(|p| code.contains(p.as_str()));
            if !found {
                missing.push(format!("function or field {s}"));
            }
        }
    }
    assert!(
        files >= 10 && fns >= 10,
        "the walk names too little to check ({files} files, {fns} functions)"
    );
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md's Life of a READ/WRITE names what no longer exists: {missing:?}"
    );
}

/// The file maps of the docs (ARCHITECTURE's crate and module tables, TESTING's table of
/// tests, the others' references) name files that exist: a `code span` that is a source file
/// name (`*.rs`, `*.sh`; a `:line` suffix allowed) must be the end of some file's path in the
/// repository (`wl/pace.rs`, `engine/src/drive.rs`, `reactor.rs`). A rename or a split that
/// forgets the docs fails here.
#[test]
fn the_docs_file_maps_name_files_that_exist() {
    let root = root();
    let mut paths = Vec::new();
    repo_files(&root, &mut paths);
    let files: Vec<String> = paths
        .iter()
        .filter_map(|p| p.strip_prefix(&root).ok())
        .map(|p| p.to_string_lossy().to_string())
        .collect();
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in [
        "ARCHITECTURE.md",
        "TESTING.md",
        "SAFETY.md",
        "FORMAT.md",
        "BAD_INPUT.md",
        "CASADM.md",
        "METRICS.md",
    ] {
        let text = std::fs::read_to_string(root.join("docs").join(doc)).expect("a doc");
        for s in spans(&text) {
            let name = s.split(':').next().unwrap_or("");
            let name = name.strip_prefix("./").unwrap_or(name);
            // Placeholders (`fuzz/fuzz_targets/NAME.rs`) name no file.
            if name.contains("NAME")
                || name.contains(' ')
                || name.contains('*')
                || name.contains('{')
                || name.starts_with('/')
                || !(name.ends_with(".rs") || name.ends_with(".sh"))
            {
                continue;
            }
            checked += 1;
            let found = files
                .iter()
                .any(|f| f == name || f.ends_with(&format!("/{name}")));
            if !found {
                missing.push(format!("{doc}: {name}"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        checked >= 100,
        "the docs name too few files to check ({checked})"
    );
    assert!(
        missing.is_empty(),
        "the docs name files that do not exist: {missing:?}"
    );
}
