//! A caller's shape and strides against a slice's length: `check_fits`, pure arithmetic.

use tensorbridge_core::Layout;
use tensorbridge_cudarc::{Error, check_fits};

fn layout(shape: &[i64], strides: &[i64], byte_offset: u64) -> Layout {
    Layout::new(shape, Some(strides), byte_offset).unwrap()
}

fn outside(r: Result<(), Error>) -> (i128, i128, usize, usize) {
    match r {
        Err(Error::OutsideSlice {
            lo,
            hi,
            len,
            nbytes,
        }) => (lo, hi, len, nbytes),
        other => panic!("expected OutsideSlice, found {other:?}"),
    }
}

#[test]
fn compact_layouts_fit_exactly_their_length() {
    let l = Layout::row_major(&[3, 4]).unwrap();
    assert!(check_fits(&l, 4, 12).is_ok());
    assert!(check_fits(&l, 4, 100).is_ok());
    assert_eq!(outside(check_fits(&l, 4, 11)), (0, 48, 11, 44));
    let f = Layout::column_major(&[3, 4]).unwrap();
    assert!(check_fits(&f, 8, 12).is_ok());
    assert_eq!(outside(check_fits(&f, 8, 11)), (0, 96, 11, 88));
}

#[test]
fn strided_layouts_count_the_last_element_reached() {
    // Every other element of 10: reaches elements 0..=8.
    let l = layout(&[5], &[2], 0);
    assert!(check_fits(&l, 4, 9).is_ok());
    assert_eq!(outside(check_fits(&l, 4, 8)), (0, 36, 8, 32));
    // A transposed 2 x 3 view of a 3 x 2 buffer.
    let t = layout(&[2, 3], &[1, 2], 0);
    assert!(check_fits(&t, 2, 6).is_ok());
    assert!(check_fits(&t, 2, 5).is_err());
}

#[test]
fn negative_strides_need_a_byte_offset() {
    // Reversed: element 0 is the buffer's last, 12 bytes in.
    let reversed = layout(&[4], &[-1], 12);
    assert!(check_fits(&reversed, 4, 4).is_ok());
    let no_offset = layout(&[4], &[-1], 0);
    assert_eq!(outside(check_fits(&no_offset, 4, 4)), (-12, 4, 4, 16));
}

#[test]
fn byte_offsets_shift_the_span() {
    let l = layout(&[4], &[1], 8);
    assert!(check_fits(&l, 4, 6).is_ok());
    assert_eq!(outside(check_fits(&l, 4, 5)), (8, 24, 5, 20));
}

#[test]
fn broadcasts_reach_one_element() {
    let b = layout(&[1000, 3], &[0, 1], 0);
    assert!(check_fits(&b, 4, 3).is_ok());
    assert!(check_fits(&b, 4, 2).is_err());
}

#[test]
fn empty_layouts_always_fit() {
    let e = layout(&[0, 5], &[5, 1], 1 << 40);
    assert!(check_fits(&e, 4, 0).is_ok());
    let scalar = Layout::row_major(&[]).unwrap();
    assert!(check_fits(&scalar, 8, 1).is_ok());
    assert!(check_fits(&scalar, 8, 0).is_err());
}

#[test]
fn huge_reaches_do_not_overflow() {
    let far = layout(&[2], &[(i64::MAX >> 8) - 1], u64::MAX / 2);
    let (lo, hi, _, _) = outside(check_fits(&far, 8, 16));
    assert!(lo > 0 && hi > lo);
}
