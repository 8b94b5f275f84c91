//! A bounds-checked front for `matrixmultiply::dgemm`.

/// A strided matrix view: row stride, column stride (elements, positive).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strides(pub usize, pub usize);

/// Last element index a `rows x cols` view with these strides touches.
fn extent(rows: usize, cols: usize, s: Strides) -> usize {
    (rows - 1) * s.0 + (cols - 1) * s.1
}

/// `C[m,n] = A[m,k] * B[k,n] + beta * C` in f64. With `beta == 0` C is
/// only written.
///
/// # Panics
/// If a view reaches past its slice or a stride does not fit `isize`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dgemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f64],
    sa: Strides,
    b: &[f64],
    sb: Strides,
    beta: f64,
    c: &mut [f64],
    sc: Strides,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        extent(m, n, sc) < c.len(),
        "C view {m}x{n} {sc:?} past {} elements",
        c.len()
    );
    if k == 0 {
        let keep = beta;
        for i in 0..m {
            for j in 0..n {
                let x = &mut c[i * sc.0 + j * sc.1];
                *x = if keep == 0.0 { 0.0 } else { *x * keep };
            }
        }
        return;
    }
    assert!(
        extent(m, k, sa) < a.len(),
        "A view {m}x{k} {sa:?} past {} elements",
        a.len()
    );
    assert!(
        extent(k, n, sb) < b.len(),
        "B view {k}x{n} {sb:?} past {} elements",
        b.len()
    );
    let st = |s: usize| isize::try_from(s).expect("stride fits isize");
    // SAFETY: the asserts above keep every element each view addresses
    // inside its slice; `c` is borrowed mutably and cannot alias `a` or `b`.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            st(sa.0),
            st(sa.1),
            b.as_ptr(),
            st(sb.0),
            st(sb.1),
            beta,
            c.as_mut_ptr(),
            st(sc.0),
            st(sc.1),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_product_matches_hand_result() {
        // A = [[1,2],[3,4]], B^T stored row-major as [[5,6],[7,8]] -> B = [[5,7],[6,8]].
        let a = [1.0, 2.0, 3.0, 4.0];
        let bt = [5.0, 6.0, 7.0, 8.0];
        let mut c = [1.0; 4];
        dgemm(
            2,
            2,
            2,
            &a,
            Strides(2, 1),
            &bt,
            Strides(1, 2),
            1.0,
            &mut c,
            Strides(2, 1),
        );
        assert_eq!(c, [1.0 + 17.0, 1.0 + 23.0, 1.0 + 39.0, 1.0 + 53.0]);
        dgemm(
            2,
            0,
            2,
            &a,
            Strides(2, 1),
            &bt,
            Strides(1, 2),
            0.0,
            &mut c,
            Strides(2, 1),
        );
        assert_eq!(c, [0.0; 4]);
    }

    #[test]
    #[should_panic(expected = "past")]
    fn view_past_the_slice_is_refused() {
        let mut c = [0.0; 3];
        dgemm(
            2,
            1,
            2,
            &[1.0, 1.0],
            Strides(1, 1),
            &[1.0, 1.0],
            Strides(1, 1),
            0.0,
            &mut c,
            Strides(2, 1),
        );
    }
}
