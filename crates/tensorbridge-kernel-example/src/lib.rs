//! The README's kernel recipe ("Your own CUDA kernel on framework tensors"), taken from
//! README.md by `build.rs` and compiled here as it is, in a PyO3 extension whose only
//! dependency is the facade (`tensorbridge` with `pyo3` and `abi3-py39`): the proof that the
//! recipe builds and that a kernel crate needs one dependency line. The Python module is
//! `tensorbridge_kernel_example`, with the recipe's `axpy`.
//!
//! pyo3's macros reach pyo3 through the facade: every `#[pyfunction]` and `#[pymodule]`
//! says `#[pyo3(crate = "tensorbridge::pyo3_crate")]` (the facade's docs, "A PyO3 extension
//! with this one dependency").

include!(concat!(env!("OUT_DIR"), "/readme_kernel.rs"));

/// The module: the recipe's function.
#[pymodule]
#[pyo3(crate = "tensorbridge::pyo3_crate")]
fn tensorbridge_kernel_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(axpy, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The README's block is what `build.rs` took: its kernel, its function, the attribute
    /// that routes pyo3's macros through the facade. (That it compiles is this crate's
    /// build.)
    #[test]
    fn the_recipe_is_the_readmes() {
        let recipe = include_str!(concat!(env!("OUT_DIR"), "/readme_kernel.rs"));
        let readme = include_str!("../../../README.md");
        assert!(readme.contains(recipe.trim_end()), "{recipe}");
        for line in [
            "static AXPY: Kernel = Kernel::new(",
            "#[pyo3(crate = \"tensorbridge::pyo3_crate\")]",
            "fn axpy(",
            "kernel_call(",
            ".arg(&mut yv)",
        ] {
            assert!(
                recipe.contains(line),
                "expected {line:?} in the recipe:\n{recipe}"
            );
        }
    }
}
