//! The crate's layering, as `src/lib.rs` states it: the code of each module in its table
//! imports only modules listed before it, and `bench`, beside them, only modules of the table.
//! Test code is left out (`#[cfg(test)] mod ... { }` blocks at the top level of a file, and
//! comments): tests may borrow from anywhere.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The modules of `src/lib.rs`'s table, lowest first: its rows ``//! | [`name`] | ...`` or
/// ``//! | `name` | ...``.
fn listed_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! | "))
        .filter_map(|row| {
            let cell = row.split('|').next()?.trim();
            let name = cell
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim_matches('`');
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .then(|| name.to_string())
        })
        .filter(|name| name != "module" && name != "layer")
        .collect()
}

/// Every `.rs` file of a module: `src/NAME.rs`, or everything under `src/NAME/`.
fn module_files(name: &str) -> Vec<PathBuf> {
    let src = root().join("src");
    let single = src.join(format!("{name}.rs"));
    if single.exists() {
        return vec![single];
    }
    let mut files = Vec::new();
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The crate modules a file's non-test code names (`crate::NAME`), with the line of each.
fn imports(path: &Path) -> Vec<(String, usize)> {
    let text = fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        // A top-level test module runs to its closing brace at the start of a line.
        if line == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("mod "))
        {
            if !lines[i + 1].trim_end().ends_with(';') {
                while i < lines.len() && lines[i] != "}" {
                    i += 1;
                }
            }
            i += 1;
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !name.is_empty() {
                found.push((name, i + 1));
            }
            rest = after;
        }
        i += 1;
    }
    found
}

#[test]
fn modules_import_only_the_modules_listed_before_them() {
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let order = listed_modules(&lib);
    assert!(
        order.len() > 10 && order.first().map(String::as_str) == Some("units"),
        "src/lib.rs's module table was not found (got {order:?})"
    );
    // Every module the crate declares is in the table, or is `bench`.
    for line in lib.lines() {
        let declared = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .map(|rest| rest.trim_end_matches(';'));
        if let Some(name) = declared {
            assert!(
                name == "bench" || order.iter().any(|m| m == name),
                "src/lib.rs declares `{name}` but its module table does not list it"
            );
        }
    }
    let mut problems = Vec::new();
    for (rank, module) in order
        .iter()
        .enumerate()
        .chain([(order.len(), &"bench".to_string())])
    {
        let allowed = &order[..rank];
        for file in module_files(module) {
            for (name, line) in imports(&file) {
                if name == *module || allowed.contains(&name) {
                    continue;
                }
                let shown = file
                    .strip_prefix(root())
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                problems.push(format!(
                    "{shown}:{line}: `{module}` imports `{name}`, which src/lib.rs lists {}",
                    if order.contains(&name) {
                        "after it"
                    } else {
                        "nowhere"
                    }
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_an_import_and_skips_test_code() {
    let dir = std::env::temp_dir().join(format!("headroom-layering-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sample.rs");
    fs::write(
        &file,
        "use crate::arena::Arena;\n// crate::server in a comment\nfn f() { crate::units::parse(\"1\"); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::bench::rng::Rng;\n}\n",
    )
    .unwrap();
    let found: Vec<String> = imports(&file).into_iter().map(|(name, _)| name).collect();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, ["arena", "units"]);

    let lib = "//! | module | what |\n//! | --- | --- |\n//! | [`units`] | sizes |\n//! | `sys` | calls |\n";
    assert_eq!(listed_modules(lib), ["units", "sys"]);
}

/// The layers inside `server`, top first, as the table of `src/server/mod.rs` lists them.
fn server_layers() -> Vec<String> {
    let top = fs::read_to_string(root().join("src/server/mod.rs")).expect("src/server/mod.rs");
    listed_modules(&top)
}

/// What a file's non-test code takes from inside `server`: (layer, file) for every
/// `crate::server::LAYER::FILE` and, with `own` its layer, every `super::FILE`; with the line.
fn server_imports(path: &Path, own: &str) -> Vec<(String, String, usize)> {
    let text = fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let mut found = Vec::new();
    let mut in_tests = false;
    for (i, line) in text.lines().enumerate() {
        if line == "#[cfg(test)]" {
            in_tests = true;
        }
        if in_tests {
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect()
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::server::") {
            let after = &rest[at + "crate::server::".len()..];
            let layer = word(after);
            let file = after[layer.len()..]
                .strip_prefix("::")
                .map(word)
                .unwrap_or_default();
            found.push((layer, file, i + 1));
            rest = after;
        }
        let mut rest = code;
        while let Some(at) = rest.find("super::") {
            let after = &rest[at + "super::".len()..];
            found.push((own.to_string(), word(after), i + 1));
            rest = after;
        }
    }
    found
}

/// `server`'s own layering: a file in one of its folders names only its own folder and the
/// layers listed after it (`net` over `ops` over `exec` over `shard`), never `super::super`;
/// a folder's `mod.rs` only declares its files, and no two files of a folder import each
/// other, even by a longer way round: so every arrow in `server` points down.
#[test]
fn server_layers_import_only_themselves_and_the_layers_below() {
    let layers = server_layers();
    assert_eq!(
        layers,
        ["net", "ops", "exec", "shard"],
        "src/server/mod.rs's layers"
    );
    let mut problems = Vec::new();
    for (rank, layer) in layers.iter().enumerate() {
        let dir = root().join("src/server").join(layer);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
        let names: Vec<String> = files.iter().map(|p| stem(p)).collect();
        // (file, sibling it imports)
        let mut edges: Vec<(String, String)> = Vec::new();
        for file in &files {
            let shown = format!("src/server/{layer}/{}.rs", stem(file));
            let text = fs::read_to_string(file).unwrap();
            if stem(file) == "mod" {
                let declares_only = text.lines().all(|l| {
                    l.is_empty()
                        || l.starts_with("//")
                        || l.starts_with("pub mod ")
                        || l.starts_with("pub(crate) mod ")
                });
                if !declares_only {
                    problems.push(format!("{shown}: a layer's mod.rs only declares its files"));
                }
                continue;
            }
            if text.contains("super::super") {
                problems.push(format!(
                    "{shown}: names super::super (name crate::server::LAYER)"
                ));
            }
            for (to_layer, to_file, line) in server_imports(file, layer) {
                match layers.iter().position(|l| *l == to_layer) {
                    Some(r) if r < rank => problems.push(format!(
                        "{shown}:{line}: `{layer}` imports `{to_layer}`, a layer above it"
                    )),
                    Some(r) if r == rank && !names.contains(&to_file) => problems.push(format!(
                        "{shown}:{line}: `{to_file}` is not a file of `{layer}`"
                    )),
                    Some(r) if r == rank => {
                        if to_file != stem(file) {
                            edges.push((stem(file), to_file));
                        }
                    }
                    Some(_) => {}
                    None => problems.push(format!(
                        "{shown}:{line}: `crate::server::{to_layer}` is not a layer"
                    )),
                }
            }
        }
        // No circle among a folder's files.
        edges.sort();
        edges.dedup();
        for start in &names {
            let mut seen = vec![start.clone()];
            let mut stack = vec![start.clone()];
            while let Some(at) = stack.pop() {
                for (_, to) in edges.iter().filter(|(from, _)| *from == at) {
                    if to == start {
                        problems.push(format!(
                            "src/server/{layer}: {start}.rs imports a file that imports it back"
                        ));
                    } else if !seen.contains(to) {
                        seen.push(to.clone());
                        stack.push(to.clone());
                    }
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "server's layering broken:\n{}",
        problems.join("\n")
    );
}
