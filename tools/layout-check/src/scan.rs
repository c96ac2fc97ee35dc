//! What one source file holds, as the checks need it: its `mod`
//! declarations, the module paths it refers to, its functions' lengths and
//! how many of its lines are test code. Items under `#[cfg(test)]` are
//! counted as test lines and otherwise skipped.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, Meta, TraitItem, UseTree};

/// A `mod name;` declaration (a module in a file of its own).
#[derive(Debug, Clone)]
pub struct ModDecl {
    /// The inline modules (`mod a { ... }`) the declaration sits in, outermost
    /// first; empty at the file's top level.
    pub inline: Vec<String>,
    /// The module's name.
    pub name: String,
    /// The `#[path = "..."]` attribute's value, if any.
    pub path_attr: Option<String>,
    /// The declaration's line.
    pub line: usize,
}

/// A path that names something through the module tree: `crate::a::b`,
/// `super::x`, `self::y`, or `child::z` for a child module.
#[derive(Debug, Clone)]
pub struct Ref {
    /// The inline modules the path is written in, outermost first.
    pub inline: Vec<String>,
    /// The path's segments, as written.
    pub segments: Vec<String>,
    /// The path's line.
    pub line: usize,
}

/// A function with a body.
#[derive(Debug, Clone)]
pub struct FnLen {
    /// The function's name.
    pub name: String,
    /// The line of its name.
    pub line: usize,
    /// Lines from the body's `{` to its `}`, both included.
    pub body_lines: usize,
}

/// Everything the checks read from one file.
#[derive(Debug, Default)]
pub struct FileScan {
    /// `mod name;` declarations outside `#[cfg(test)]`.
    pub mods: Vec<ModDecl>,
    /// Inline modules (their full inline paths), outside `#[cfg(test)]`.
    pub inline_mods: Vec<Vec<String>>,
    /// Module-tree paths outside `#[cfg(test)]`.
    pub refs: Vec<Ref>,
    /// Functions with bodies outside `#[cfg(test)]`.
    pub fns: Vec<FnLen>,
    /// Lines in the file.
    pub total_lines: usize,
    /// Lines taken by `#[cfg(test)]` items (with their attributes).
    pub test_lines: usize,
}

impl FileScan {
    /// Lines that are not test code.
    pub fn non_test_lines(&self) -> usize {
        self.total_lines - self.test_lines
    }
}

/// Parses `source` and gathers what the checks need.
pub fn scan(source: &str) -> syn::Result<FileScan> {
    let file = syn::parse_file(source)?;
    let mut v = Scanner {
        out: FileScan {
            total_lines: source.lines().count(),
            ..FileScan::default()
        },
        inline: Vec::new(),
    };
    v.visit_file(&file);
    Ok(v.out)
}

/// Whether the attributes hold a `#[cfg(...)]` that is only true in tests:
/// `cfg(test)`, `cfg(all(test, ...))`; not `cfg(not(test))`.
pub fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Meta::List(list) = &a.meta else {
            return false;
        };
        let mut idents = Vec::new();
        collect_idents(list.tokens.clone(), &mut idents);
        idents.iter().any(|i| i == "test") && !idents.iter().any(|i| i == "not" || i == "any")
    })
}

fn collect_idents(tokens: TokenStream, out: &mut Vec<String>) {
    for t in tokens {
        match t {
            TokenTree::Ident(i) => out.push(i.to_string()),
            TokenTree::Group(g) => collect_idents(g.stream(), out),
            _ => {}
        }
    }
}

fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

fn trait_item_attrs(item: &TraitItem) -> &[Attribute] {
    match item {
        TraitItem::Const(i) => &i.attrs,
        TraitItem::Fn(i) => &i.attrs,
        TraitItem::Type(i) => &i.attrs,
        TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The lines an item spans, its attributes included.
fn lines_of(node: &impl Spanned) -> usize {
    let span = node.span();
    span.end().line + 1 - span.start().line
}

struct Scanner {
    out: FileScan,
    inline: Vec<String>,
}

impl Scanner {
    fn push_ref(&mut self, segments: Vec<String>, line: usize) {
        if segments.len() >= 2 {
            self.out.refs.push(Ref {
                inline: self.inline.clone(),
                segments,
                line,
            });
        }
    }

    fn push_fn(&mut self, ident: &syn::Ident, block: &syn::Block) {
        let open = block.brace_token.span.open().start().line;
        let close = block.brace_token.span.close().end().line;
        self.out.fns.push(FnLen {
            name: ident.to_string(),
            line: ident.span().start().line,
            body_lines: close + 1 - open,
        });
    }

    /// Every path of a `use` tree, each as its full list of segments.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.push_ref(full, n.ident.span().start().line);
            }
            UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.push_ref(full, r.ident.span().start().line);
            }
            UseTree::Glob(g) => {
                // `use super::*` names the module itself: a path of one
                // segment more than the module's, which resolves to it.
                let mut full = prefix.clone();
                full.push("*".to_string());
                self.push_ref(full, g.star_token.span.start().line);
            }
            UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
            }
        }
    }

    /// Paths starting with `crate`, `super` or `self` in a macro's tokens
    /// (`asm!`'s `sym crate::x::f`, `assert!(... crate::a::B ...)`).
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => {
                    self.macro_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id)
                    if (id == "crate" || id == "super" || id == "self")
                        && !matches!(i.checked_sub(1).map(|p| &tokens[p]),
                            Some(TokenTree::Punct(p)) if p.as_char() == '$' || p.as_char() == ':') =>
                {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':'
                        {
                            break;
                        }
                        segments.push(next.to_string());
                        j += 3;
                    }
                    self.push_ref(segments, line);
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Scanner {
    fn visit_item(&mut self, item: &'ast Item) {
        if is_test(item_attrs(item)) {
            self.out.test_lines += lines_of(item);
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if is_test(impl_item_attrs(item)) {
            self.out.test_lines += lines_of(item);
            return;
        }
        visit::visit_impl_item(self, item);
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        if is_test(trait_item_attrs(item)) {
            self.out.test_lines += lines_of(item);
            return;
        }
        visit::visit_trait_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        match &m.content {
            None => self.out.mods.push(ModDecl {
                inline: self.inline.clone(),
                name: m.ident.to_string(),
                path_attr: path_attr(&m.attrs),
                line: m.ident.span().start().line,
            }),
            Some((_, items)) => {
                self.inline.push(m.ident.to_string());
                self.out.inline_mods.push(self.inline.clone());
                for item in items {
                    self.visit_item(item);
                }
                self.inline.pop();
            }
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.push_fn(&f.sig.ident, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.push_fn(&f.sig.ident, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.push_fn(&f.sig.ident, block);
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.push_ref(segments, p.span().start().line);
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.macro_tokens(m.tokens.clone());
    }

    // Attributes (`#[cfg(...)]`, `#[derive(...)]`, doc links) and
    // visibilities (`pub(super)`, `pub(in crate::a)`) are not uses of items.
    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}
