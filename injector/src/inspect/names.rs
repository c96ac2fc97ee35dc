//! The names people write for a symbol: its source name without the
//! suffix of a compiler's clone (`parse_field` for `parse_field.isra.0`),
//! and demangled C++ and Rust names, with and without the parameter list.
//!
//! Patterns match these as well as the linkage name (see
//! [`Pattern`](super::Pattern) and `docs/report-format.md`), as gdb, perf
//! and bpftrace do.

/// Suffix words of the clones compilers make of a function: GCC's
/// interprocedural scalar replacement (`.isra`), constant propagation
/// (`.constprop`), partial inlining (`.part`), LTO privatisation
/// (`.lto_priv`) and local aliases; LLVM's ThinLTO promotion (`.llvm`),
/// function specialisation (`.specialized`) and unique internal names
/// (`.__uniq`). Each may be followed by a number (`.isra.0`).
/// `.cold` is not among them: a cold part is a piece of its parent, not a
/// function of its own (`exits::cold_part_of` reads it).
const CLONE_WORDS: &[&str] = &[
    "isra",
    "constprop",
    "part",
    "lto_priv",
    "localalias",
    "clone",
    "llvm",
    "specialized",
    "__uniq",
];

/// Splits a linkage name into its source name and a compiler clone's
/// suffix: `("parse_field", Some(".isra.0"))` for `parse_field.isra.0`,
/// `("_ZN5Cache6lookupEi", Some(".constprop.0"))`, and `(name, None)` for
/// anything else, a `.cold` part (`work.cold`) or a Go name (`main.main`)
/// among them. A suffix is only dots, numbers and clone words (`isra`,
/// `constprop`, `part`, `llvm`, ...: `.constprop.0.isra.0`), starting with
/// a word.
pub fn split_clone(name: &str) -> (&str, Option<&str>) {
    let Some(dot) = name.get(1..).and_then(|s| s.find('.')).map(|i| i + 1) else {
        return (name, None);
    };
    let suffix = &name[dot..];
    let mut parts = suffix[1..].split('.');
    let starts_with_word = parts
        .next()
        .is_some_and(|first| CLONE_WORDS.contains(&first));
    let rest_ok = suffix[1..].split('.').all(|part| {
        CLONE_WORDS.contains(&part)
            || (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    });
    if starts_with_word && rest_ok {
        (&name[..dot], Some(suffix))
    } else {
        (name, None)
    }
}

/// A symbol's names besides its linkage name, when it has any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceNames {
    /// The demangled name with its parameter list (`Cache::get(int) const`,
    /// `ns::f(char const*)`), or the source name of a C clone
    /// (`parse_field`): what reports print.
    pub full: String,
    /// Without parameters, return type and ABI tags (`Cache::get`,
    /// `ns::max_of<int>`): what a pattern without `(` matches.
    pub short: String,
    /// Whether the name is a C++ or Rust path whose leading scopes a pattern
    /// may leave out (`Cache::get` for `app::Cache::get`).
    pub scoped: bool,
}

/// The source names of linkage name `name` (its `@VERSION` suffix, if any,
/// ignored), or `None` when it is its own source name (a C function that
/// is no clone, a name that does not demangle).
pub fn source_names(name: &str) -> Option<SourceNames> {
    let name = name.split('@').next().unwrap_or(name);
    let (base, clone) = split_clone(name);
    if base.starts_with("_R") || base.starts_with("_ZN") {
        // Rust first: legacy Rust names are valid C++ manglings too, but
        // carry a hash that only rustc_demangle drops. `{:#}` drops it.
        if let Ok(d) = rustc_demangle::try_demangle(base) {
            let path = format!("{d:#}");
            return Some(SourceNames {
                full: path.clone(),
                short: path,
                scoped: true,
            });
        }
    }
    if base.starts_with("_Z") {
        if let Some(names) = demangle_cpp(base) {
            return Some(names);
        }
    }
    clone.map(|_| SourceNames {
        full: base.to_owned(),
        short: base.to_owned(),
        scoped: false,
    })
}

/// The C++ forms of an Itanium-mangled name, `None` if it does not parse.
fn demangle_cpp(base: &str) -> Option<SourceNames> {
    use cpp_demangle::{DemangleOptions, Symbol};
    let sym = Symbol::new(base).ok()?;
    let full = sym
        .demangle_with_options(&DemangleOptions::new().no_return_type())
        .ok()?;
    let short = sym
        .demangle_with_options(&DemangleOptions::new().no_params().no_return_type())
        .ok()?;
    // Data symbols (`typeinfo for X`, guard variables) have no function
    // name to offer; they are no functions either.
    Some(SourceNames {
        full,
        short: strip_abi_tags(&short),
        scoped: true,
    })
}

/// `f[abi:cxx11]` as `f`: nobody types the tags GCC's new string ABI adds.
fn strip_abi_tags(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find("[abi:") {
        out.push_str(&rest[..i]);
        match rest[i..].find(']') {
            Some(end) => rest = &rest[i + end + 1..],
            None => {
                rest = &rest[i..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `name` and the names left when its leading scopes are dropped one by
/// one at each top-level `::` (`a::B::f`, `B::f`, `f`); `::` inside
/// template arguments or parameter lists is no scope of `name`.
pub fn scope_tails(name: &str) -> impl Iterator<Item = &str> {
    let bytes = name.as_bytes();
    let mut depth = 0i32;
    let mut cuts = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth -= 1,
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                cuts.push(i + 2);
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    std::iter::once(name).chain(cuts.into_iter().map(move |c| &name[c..]))
}

/// The name reports print for linkage name `name`: its demangled form
/// with parameters, the source name of a clone, else `name` itself.
pub fn display_name(name: &str) -> String {
    match source_names(name) {
        Some(s) => s.full,
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_suffixes() {
        assert_eq!(
            split_clone("parse_field.isra.0"),
            ("parse_field", Some(".isra.0"))
        );
        assert_eq!(
            split_clone("scale.constprop.0"),
            ("scale", Some(".constprop.0"))
        );
        assert_eq!(split_clone("lookup.part.0"), ("lookup", Some(".part.0")));
        assert_eq!(
            split_clone("helper.llvm.3749119731332762402"),
            ("helper", Some(".llvm.3749119731332762402"))
        );
        assert_eq!(
            split_clone("f.constprop.0.isra.0"),
            ("f", Some(".constprop.0.isra.0"))
        );
        assert_eq!(
            split_clone("_ZN5Cache6lookupEi.isra.0"),
            ("_ZN5Cache6lookupEi", Some(".isra.0"))
        );
        for plain in [
            "work.cold",
            "work.isra.0.cold",
            "main.main",
            "runtime.goexit",
            "malloc",
            ".isra.0",
            "f.",
            "f.isra.",
            "f.0",
        ] {
            assert_eq!(split_clone(plain), (plain, None), "{plain}");
        }
    }

    #[test]
    fn source_names_of_c_cpp_and_rust() {
        assert_eq!(source_names("malloc"), None);
        assert_eq!(source_names("work.cold"), None);
        let s = source_names("parse_field.isra.0").unwrap();
        assert_eq!(
            (s.full.as_str(), s.short.as_str()),
            ("parse_field", "parse_field")
        );
        assert!(!s.scoped);
        let s = source_names("_ZNK5Cache3getEi").unwrap();
        assert_eq!(s.full, "Cache::get(int) const");
        assert_eq!(s.short, "Cache::get");
        let s = source_names("_ZN3app5Cache6lookupEi.isra.0").unwrap();
        assert_eq!(s.full, "app::Cache::lookup(int)");
        assert_eq!(s.short, "app::Cache::lookup");
        let s = source_names("_Z6max_ofIiET_S0_S0_").unwrap();
        assert_eq!(s.full, "max_of<int>(int, int)");
        assert_eq!(s.short, "max_of<int>");
        let s = source_names("_Z16dispatch_command19enum_server_commandP3THDPcjbb").unwrap();
        assert_eq!(s.short, "dispatch_command");
        // GCC's new string ABI tag.
        let s = source_names("_Z4nameB5cxx11v").unwrap();
        assert_eq!(s.short, "name");
        let s = source_names("_ZN4weft7process7Process6attach17h0123456789abcdefE").unwrap();
        assert_eq!(s.short, "weft::process::Process::attach");
        let s = source_names("_ZN4weft4main17h0123456789abcdefE.llvm.1234").unwrap();
        assert_eq!(s.full, "weft::main");
        assert_eq!(source_names("_Zgarbage"), None);
        assert_eq!(display_name("_Z6middlei"), "middle(int)");
        assert_eq!(display_name("lookup.part.0"), "lookup");
        assert_eq!(display_name("free"), "free");
    }

    #[test]
    fn scope_tails_cut_at_top_level_scopes() {
        let tails: Vec<&str> = scope_tails("a::B<c::D>::f").collect();
        assert_eq!(tails, ["a::B<c::D>::f", "B<c::D>::f", "f"]);
        let tails: Vec<&str> = scope_tails("f(std::string)").collect();
        assert_eq!(tails, ["f(std::string)"]);
        assert_eq!(scope_tails("f").count(), 1);
    }
}
