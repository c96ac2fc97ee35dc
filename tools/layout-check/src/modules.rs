//! A crate's module tree, from its root file through every `mod name;`
//! outside `#[cfg(test)]`: `name.rs` or `name/mod.rs` next to a root or
//! `mod.rs` file, `parent/name.rs` or `parent/name/mod.rs` under any other
//! file, and `#[path = "..."]` relative to the declaring file's folder.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::scan::{scan, FileScan};

/// One file of the tree: a file module.
#[derive(Debug)]
pub struct FileModule {
    /// Its path.
    pub path: PathBuf,
    /// Its module path from the crate root (empty for the root).
    pub module: Vec<String>,
    /// What the file holds.
    pub scan: FileScan,
}

/// A crate's module tree.
#[derive(Debug, Default)]
pub struct Tree {
    /// Its files, the root first.
    pub files: Vec<FileModule>,
    /// Every module path (inline modules included) and the file that holds
    /// it: an inline module belongs to its file.
    pub modules: HashMap<Vec<String>, usize>,
    /// Problems that did not stop the walk: a declared module without a
    /// file, a file that does not parse.
    pub notes: Vec<String>,
}

/// Reads a file: the file system in the tool, a table in its tests.
pub type Read<'a> = &'a dyn Fn(&Path) -> io::Result<String>;

/// Loads the tree rooted at `root` (`src/lib.rs`, `src/main.rs`, ...).
pub fn load(root: &Path, read: Read) -> Tree {
    let mut tree = Tree::default();
    add_file(&mut tree, root.to_path_buf(), Vec::new(), true, read);
    tree
}

fn add_file(tree: &mut Tree, path: PathBuf, module: Vec<String>, is_root: bool, read: Read) {
    let scan = match read(&path).map(|s| scan(&s)) {
        Ok(Ok(scan)) => scan,
        Ok(Err(e)) => {
            let line = e.span().start().line;
            tree.notes
                .push(format!("{}:{line}: does not parse: {e}", path.display()));
            return;
        }
        Err(e) => {
            tree.notes.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    let index = tree.files.len();
    tree.modules.insert(module.clone(), index);
    for inline in &scan.inline_mods {
        tree.modules
            .insert([module.clone(), inline.clone()].concat(), index);
    }
    let folder = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let is_mod_rs = is_root || path.file_name().is_some_and(|n| n == "mod.rs");
    // Where this file's child modules live.
    let children = if is_mod_rs {
        folder.clone()
    } else {
        folder.join(path.file_stem().unwrap_or_default())
    };
    let decls = scan.mods.clone();
    tree.files.push(FileModule {
        path: path.clone(),
        module: module.clone(),
        scan,
    });
    for decl in decls {
        let mut dir = children.clone();
        for name in &decl.inline {
            dir.push(name);
        }
        let candidates = match &decl.path_attr {
            Some(p) if decl.inline.is_empty() => vec![folder.join(p)],
            Some(p) => vec![dir.join(p)],
            None => vec![
                dir.join(format!("{}.rs", decl.name)),
                dir.join(&decl.name).join("mod.rs"),
            ],
        };
        let Some(file) = candidates.iter().find(|c| read(c).is_ok()) else {
            tree.notes.push(format!(
                "{}:{}: no file for `mod {}` (looked for {})",
                path.display(),
                decl.line,
                decl.name,
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        let child = [module.clone(), decl.inline.clone(), vec![decl.name.clone()]].concat();
        add_file(tree, file.clone(), child, false, read);
    }
}
